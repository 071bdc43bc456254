"""Score WAV files with LiveKit's local turn detector (v1-mini), as the agent would hear them
end: the probability that the turn is over, 0.2 s into the silence after the file (when the
agent asks the detector). v1-mini's threshold for English is 0.36: below it, the agent waits
its maximum endpointing delay. Used to pick the test sentences (scripts/make-test-speech.sh).

    .venv/bin/python scripts/turn-detector-score.py tests/data/e2e_*.wav
"""

from __future__ import annotations

import asyncio
import sys
import wave

import numpy as np
from livekit import rtc
from livekit.agents.inference import TurnDetector
from livekit.local_inference import init_eot

RATE, FRAME = 16000, 160  # 10 ms frames, as the room gives them (after resampling)


async def score(detector: TurnDetector, pcm: np.ndarray) -> float:
    stream = detector.stream()
    audio = np.concatenate([np.zeros(RATE // 2, np.int16), pcm, np.zeros(RATE // 5, np.int16)])
    for i in range(0, len(audio) - FRAME + 1, FRAME):
        stream.push_audio(rtc.AudioFrame(audio[i:i + FRAME].tobytes(), RATE, 1, FRAME))
        await asyncio.sleep(0)
    event = await asyncio.wait_for(stream.predict(), 10)
    await stream.aclose()
    return event.end_of_turn_probability


async def main(paths: list[str]) -> None:
    init_eot()
    detector = TurnDetector(version="v1-mini")
    for path in paths:
        with wave.open(path) as w:
            if (w.getframerate(), w.getnchannels(), w.getsampwidth()) != (RATE, 1, 2):
                sys.exit(f"{path}: expected 16 kHz mono 16-bit PCM")
            pcm = np.frombuffer(w.readframes(w.getnframes()), np.int16)
        print(f"{await score(detector, pcm):.2f}  {path}", flush=True)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    asyncio.run(main(sys.argv[1:]))
