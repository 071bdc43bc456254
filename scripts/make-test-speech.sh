#!/usr/bin/env bash
# Regenerate the synthesised utterances the end-to-end tests and the benchmark speak into the
# room (tests/data/e2e_*.wav: 16 kHz mono PCM16, leading and trailing silence trimmed, so the
# end of the file is the end of speech). Needs Debian's espeak-ng and sox.
set -euo pipefail
OUT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/tests/data"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

speak() {  # name, text
    espeak-ng -v en-us -s 165 -w "$TMP/$1.raw.wav" "$2"
    sox "$TMP/$1.raw.wav" -r 16000 -c 1 -b 16 "$OUT/e2e_$1.wav" \
        silence 1 0.02 1% reverse silence 1 0.02 1% reverse norm -3
    echo "e2e_$1.wav: $(soxi -D "$OUT/e2e_$1.wav") s  \"$2\""
}

speak q1_time "What time is it in Paris right now?"
speak q2_weather "Tell me something nice about the weather today."
speak q3_recall "And what was the first thing I asked you?"
speak barge_in "Wait, stop. I have a different question."

# A 200 ms burst: a voiced sound short enough to be noise, not a turn.
espeak-ng -v en-us -w "$TMP/ah.raw.wav" "aaah"
sox "$TMP/ah.raw.wav" -r 16000 -c 1 -b 16 "$TMP/ah.wav" \
    silence 1 0.02 1% reverse silence 1 0.02 1% reverse norm -3
sox "$TMP/ah.wav" "$OUT/e2e_burst_200ms.wav" trim 0.05 0.2 fade 0.01 0.2 0.01
echo "e2e_burst_200ms.wav: $(soxi -D "$OUT/e2e_burst_200ms.wav") s"
