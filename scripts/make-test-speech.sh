#!/usr/bin/env bash
# Regenerate the synthesised utterances the end-to-end tests and the benchmark speak into the
# room (tests/data/e2e_*.wav: 16 kHz mono PCM16, leading and trailing silence trimmed, so the
# end of the file is the end of speech). Needs Debian's espeak-ng and sox.
#
# The voice and the sentences are chosen so that LiveKit's audio turn detector (v1-mini) hears
# a finished turn (probability 0.5-0.7 a moment after the end); robotic questions score ~0.1,
# which makes the agent wait its maximum endpointing delay, as it would for a human who
# trails off mid-sentence.
set -euo pipefail
OUT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/tests/data"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

speak() {  # name, text
    espeak-ng -v en-us+f3 -s 175 -w "$TMP/$1.raw.wav" "$2"
    sox "$TMP/$1.raw.wav" -r 16000 -c 1 -b 16 "$OUT/e2e_$1.wav" \
        silence 1 0.02 1% reverse silence 1 0.02 1% reverse norm -3
    echo "e2e_$1.wav: $(soxi -D "$OUT/e2e_$1.wav") s  \"$2\""
}

speak q1_time "Tell me the time in Paris."
speak q2_weather "I would like to know the weather today, please."
speak q3_recall "Now tell me what I asked you first."
speak q4_thanks "Okay, thank you very much."
speak barge_in "Wait, stop. I have another question."
speak stop "Stop, please."

# A 200 ms burst: a voiced sound short enough to be noise, not a turn.
espeak-ng -v en-us+f3 -w "$TMP/ah.raw.wav" "aaah"
sox "$TMP/ah.raw.wav" -r 16000 -c 1 -b 16 "$TMP/ah.wav" \
    silence 1 0.02 1% reverse silence 1 0.02 1% reverse norm -3
sox "$TMP/ah.wav" "$OUT/e2e_burst_200ms.wav" trim 0.05 0.2 fade 0.01 0.2 0.01
echo "e2e_burst_200ms.wav: $(soxi -D "$OUT/e2e_burst_200ms.wav") s"
