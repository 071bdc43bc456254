#!/usr/bin/env bash
# Regenerate the utterances the end-to-end tests and the benchmarks speak into the room
# (tests/data/e2e_*.wav: 16 kHz mono PCM16, leading and trailing silence trimmed, so the end of
# the file is the end of speech). Needs Debian's festival, festvox-us-slt-hts and sox, and
# espeak-ng for the hard case (scripts/setup installs them all).
#
# The voice is festival's HTS voice cmu_us_slt_arctic_hts: natural enough that LiveKit's audio
# turn detector (v1-mini) hears a finished sentence as finished, as it would a person. One
# espeak-ng utterance stays as the hard case: its robotic ending scores below the detector's
# threshold, so the agent waits its maximum endpointing delay, as it would for a person who
# trails off mid-sentence.
set -euo pipefail
OUT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)/tests/data"
TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

trim() {  # in, out: 16 kHz mono 16-bit, silence cut at both ends, -3 dBFS peak
    sox "$1" -r 16000 -c 1 -b 16 "$2" silence 1 0.02 1% reverse silence 1 0.02 1% reverse norm -3
}

speak() {  # name, text
    printf '%s\n' "$2" | text2wave -eval '(voice_cmu_us_slt_arctic_hts)' -o "$TMP/$1.raw.wav"
    trim "$TMP/$1.raw.wav" "$OUT/e2e_$1.wav"
    echo "e2e_$1.wav: $(soxi -D "$OUT/e2e_$1.wav") s  \"$2\""
}

# The questions are worded so that the turn detector hears them end: its probability on the
# clean file right after it, against v1-mini's threshold of 0.36 for English, is in brackets
# (scripts/turn-detector-score.py). "Tell me the time in Paris." scores 0.30 in this voice.
speak q1_time "Can you tell me the time in Paris, please?"          # 0.57
speak q2_weather "What will the weather be like today?"             # 0.59
speak q3_recall "What did I ask you first?"                         # 0.45
speak q4_thanks "Okay, thank you very much."                        # 0.75
speak barge_in "Wait, stop. I have another question."              # 0.48
speak stop "Stop, please."                                          # 0.57
# One sentence said in two parts with a pause between them (the caller leaves the gap): the
# first part ends mid-sentence, so the agent must wait for the rest and answer the whole.
speak pause_first "So what I would really like to know is"         # 0.17: not over
speak pause_rest "what the weather will be like tomorrow."

# The hard case: espeak-ng's robotic voice, a question it says with a flat end.
espeak-ng -v en-us+f3 -s 175 -w "$TMP/espeak.raw.wav" "What is the weather like today"  # 0.13
trim "$TMP/espeak.raw.wav" "$OUT/e2e_espeak_weather.wav"
echo "e2e_espeak_weather.wav: $(soxi -D "$OUT/e2e_espeak_weather.wav") s (espeak-ng)"

# A 200 ms burst: a voiced sound short enough to be noise, not a turn.
espeak-ng -v en-us+f3 -w "$TMP/ah.raw.wav" "aaah"
trim "$TMP/ah.raw.wav" "$TMP/ah.wav"
sox "$TMP/ah.wav" "$OUT/e2e_burst_200ms.wav" trim 0.05 0.2 fade 0.01 0.2 0.01
echo "e2e_burst_200ms.wav: $(soxi -D "$OUT/e2e_burst_200ms.wav") s"
