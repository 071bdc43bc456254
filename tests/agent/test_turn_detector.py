"""The end-of-turn models in the inference process: the job's side keeps and sends the audio the
models need (v1-mini scores the same 1.2 s livekit-agents' own transport would), the runner scores
it as the models do, and the score sets how long the turn waits (TurnPolicy): the answer comes
when that silence is over, and speech before then withdraws the question."""

from __future__ import annotations

import asyncio
import struct
import wave
from pathlib import Path

import numpy as np
import pytest
from livekit import rtc
from livekit.local_inference import EOT, EOT_MAX_SAMPLES

from agent import smart_turn
from agent.turn_detector import (
    METHOD,
    SMART_TURN,
    V1_MINI,
    EndOfTurnRunner,
    Scores,
    SharedTurnDetector,
    TurnDecision,
    TurnPolicy,
    combined_score,
    request,
)

DATA = Path(__file__).resolve().parents[1] / "data"


def read_wav(name: str) -> np.ndarray:
    with wave.open(str(DATA / name)) as w:
        return np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16)


class InferenceProcess:
    """What the job's `inference_executor` reaches: the runner, as the inference process runs it."""

    def __init__(self) -> None:
        self.runner = EndOfTurnRunner()
        self.runner.initialize()
        self.sent: list[bytes] = []

    async def do_inference(self, method: str, data: bytes) -> bytes | None:
        assert method == METHOD
        self.sent.append(data[1:])  # after the byte naming the models
        return await asyncio.to_thread(self.runner.run, data)


async def predict_after(stream, audio: np.ndarray, frame: int = 640) -> float:  # noqa: ANN001
    for i in range(0, len(audio) - frame + 1, frame):
        stream.push_audio(rtc.AudioFrame(audio[i:i + frame].tobytes(), 16000, 1, frame))
    await asyncio.sleep(0.05)  # the stream's task hands the frames to the transport
    event = await asyncio.wait_for(stream.predict(), 10)
    return event.end_of_turn_probability


async def test_a_prediction_scores_the_last_1_2_s_as_the_local_model_does() -> None:
    process = InferenceProcess()
    detector = SharedTurnDetector(process)  # type: ignore[arg-type]
    decisions: list[TurnDecision] = []
    detector.on_decision = decisions.append
    stream = detector.stream()
    speech = np.concatenate([read_wav("e2e_q2_weather.wav"), np.zeros(4000, dtype=np.int16)])
    speech = speech[:len(speech) // 640 * 640]
    try:
        probability = await predict_after(stream, speech)
        assert np.array_equal(np.frombuffer(process.sent[-1], dtype=np.int16), speech[-EOT_MAX_SAMPLES:])
        # the default policy: v1-mini's score, read as "the end" (1) or "not yet" (0) when the wait is over
        expected = struct.unpack("<f", struct.pack("<f", EOT().predict(speech[-EOT_MAX_SAMPLES:])))[0]
        assert decisions[-1].scores.v1_mini == expected and decisions[-1].scores.smart_turn is None
        assert probability == (0.0 if decisions[-1].wait_s >= 2.5 else 1.0)

        stream.flush()  # a turn boundary: what came before is not the next turn's
        await predict_after(stream, speech[:6400])
        assert np.array_equal(np.frombuffer(process.sent[-1], dtype=np.int16), speech[:6400])
    finally:
        await stream.aclose()


async def test_a_failed_prediction_reads_as_not_the_end() -> None:
    class Broken:
        async def do_inference(self, method: str, data: bytes) -> bytes | None:
            raise RuntimeError("the inference process is gone")

    stream = SharedTurnDetector(Broken()).stream()  # type: ignore[arg-type]
    try:
        assert await predict_after(stream, np.zeros(6400, dtype=np.int16)) == 0.0
    finally:
        await stream.aclose()


def policy(**overrides: float | str) -> TurnPolicy:
    values: dict = {"detector": "v1-mini", "min_delay_s": 0.25, "max_delay_s": 2.5, "unsure_delay_s": 1.3,
                    "sure": 0.65, "unsure": 0.45, "unlikely": 0.01}
    return TurnPolicy(**{**values, **overrides})


def test_the_wait_shortens_as_the_score_rises() -> None:
    p = policy()
    assert p.wait_s(0.9) == p.wait_s(0.65) == 0.25  # sure: the minimum delay
    assert p.wait_s(0.005) == p.wait_s(0.01) == 2.5  # unlikely: the maximum
    assert p.wait_s(0.02) == p.wait_s(0.3) == p.wait_s(0.45) == 1.3  # unsure
    waits = [p.wait_s(s) for s in (0.46, 0.5, 0.6, 0.64)]
    assert waits == sorted(waits, reverse=True) and 0.25 < waits[-1] < waits[0] < 1.3
    # one threshold for all three: livekit-agents' own yes-or-no reading
    legacy = policy(sure=0.36, unsure=0.36, unlikely=0.36)
    assert legacy.wait_s(0.36) == 0.25 and legacy.wait_s(0.35) == 2.5


def test_each_detector_scores_with_its_own_models() -> None:
    scores = Scores(v1_mini=0.5, smart_turn=0.9)
    assert policy().score(scores) == 0.5
    assert policy(detector="smart-turn").score(scores) == 0.9
    assert policy(detector="combined").score(scores) == combined_score(0.5, 0.9) > 0.5
    assert combined_score(0.5, 0.1) < 0.5  # Smart Turn's "not yet" pulls it down
    assert policy(detector="combined").score(Scores(0.5, None)) == 0.0  # a model missing: not the end


class Scripted:
    """An inference process that answers every request with the same scores."""

    def __init__(self, v1: float, st: float = float("nan")) -> None:
        self.answer = struct.pack("<ff", v1, st)
        self.models: list[int] = []

    async def do_inference(self, method: str, data: bytes) -> bytes | None:
        self.models.append(data[0])
        return self.answer


async def ask(stream, seconds: float = 0.6) -> asyncio.Future:  # noqa: ANN001
    audio = np.zeros(int(16000 * seconds) // 640 * 640, dtype=np.int16)
    for i in range(0, len(audio), 640):
        stream.push_audio(rtc.AudioFrame(audio[i:i + 640].tobytes(), 16000, 1, 640))
    await asyncio.sleep(0.05)
    return stream.predict()


async def test_an_unsure_turn_is_answered_when_its_wait_is_over() -> None:
    detector = SharedTurnDetector(Scripted(0.3), policy(unsure_delay_s=0.7))  # type: ignore[arg-type]
    stream = detector.stream()
    try:
        loop = asyncio.get_running_loop()
        asked = loop.time()
        event = await asyncio.wait_for(await ask(stream), 5)
        # asked 0.2 s into the silence: about 0.5 s more for a wait of 0.7 s less a little
        assert event.end_of_turn_probability == 1.0
        assert loop.time() - asked >= 0.25
        assert stream.prediction_timeout > 2.5  # the framework waits for the answer
    finally:
        await stream.aclose()


async def test_speech_inside_the_wait_withdraws_the_question() -> None:
    detector = SharedTurnDetector(Scripted(0.3), policy(unsure_delay_s=1.5))  # type: ignore[arg-type]
    stream = detector.stream()
    answers: list[float] = []
    resolve = stream._resolve_prediction
    stream._resolve_prediction = lambda request_id, p, **kw: (answers.append(p), resolve(request_id, p, **kw))
    try:
        future = await ask(stream)
        await asyncio.sleep(0.3)
        stream.cancel_inference()  # what livekit-agents does when the VAD hears speech again
        assert future.result().end_of_turn_probability == 0.0
        await asyncio.sleep(1.5)
        assert answers == []  # nothing was answered for the withdrawn question
    finally:
        await stream.aclose()


async def test_sure_and_unlikely_turns_are_answered_at_once() -> None:
    for v1, expected in ((0.9, 1.0), (0.01, 0.0)):
        detector = SharedTurnDetector(Scripted(v1), policy())  # type: ignore[arg-type]
        stream = detector.stream()
        try:
            event = await asyncio.wait_for(await ask(stream), 0.5)
            assert event.end_of_turn_probability == expected
        finally:
            await stream.aclose()


async def test_the_combined_detector_asks_both_models_for_the_last_8_s() -> None:
    process = Scripted(0.5, 0.99)
    detector = SharedTurnDetector(process, policy(detector="combined"))  # type: ignore[arg-type]
    decisions: list[TurnDecision] = []
    detector.on_decision = decisions.append
    stream = detector.stream()
    try:
        await asyncio.wait_for(await ask(stream, 10.0), 5)
        assert process.models == [V1_MINI | SMART_TURN]
        assert decisions[0].scores == Scores(0.5, pytest.approx(0.99))
    finally:
        await stream.aclose()


needs_model = pytest.mark.skipif(not smart_turn.model_path().is_file(),
                                 reason="Smart Turn's model is not fetched: python -m agent.smart_turn fetch")


def test_smart_turn_features_are_whispers_log_mel() -> None:
    transformers = pytest.importorskip("transformers")
    speech = read_wav("e2e_q2_weather.wav")
    padded = np.concatenate([np.zeros(smart_turn.WINDOW_SAMPLES - len(speech), np.float32),
                             speech.astype(np.float32) / 32768])
    extractor = transformers.WhisperFeatureExtractor(feature_size=80, sampling_rate=16000, chunk_length=8)
    expected = extractor(padded, sampling_rate=16000, return_tensors="np", do_normalize=True).input_features[0]
    assert np.abs(smart_turn.features(speech) - expected).max() < 1e-3


@needs_model
def test_smart_turn_runs_here_and_the_runner_returns_both_scores() -> None:
    runner = EndOfTurnRunner()
    runner.initialize()
    speech = np.concatenate([read_wav("e2e_q1_time.wav"), np.zeros(3200, np.int16)])
    v1, st = struct.unpack("<ff", runner.run(request(V1_MINI | SMART_TURN, speech.tobytes())))
    assert 0 <= v1 <= 1 and 0 <= st <= 1
    assert st == pytest.approx(smart_turn.SmartTurn().predict(speech), abs=1e-5)
    v1_only, st_none = struct.unpack("<ff", runner.run(request(V1_MINI, speech.tobytes())))
    assert v1_only == pytest.approx(v1) and np.isnan(st_none)


async def test_speech_over_a_reply_is_answered_after_the_minimum_delay() -> None:
    """A barge-in is a turn whatever it sounds like (agent/barge_in.py decides which speech over
    a reply is one): answered at once, before the false-interruption timeout could resume the
    paused reply."""
    detector = SharedTurnDetector(Scripted(0.3), policy())  # type: ignore[arg-type]
    detector.barging_in = lambda: True
    decisions: list[TurnDecision] = []
    detector.on_decision = decisions.append
    stream = detector.stream()
    try:
        event = await asyncio.wait_for(await ask(stream), 0.5)
        assert event.end_of_turn_probability == 1.0 and decisions[0].wait_s == 0.25
    finally:
        await stream.aclose()
