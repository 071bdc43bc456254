"""When the caller's turn is over: the end-of-turn models, once per agent worker, and the wait
that their answer sets.

The models. LiveKit's `v1-mini` (livekit-local-inference: the last 1.2 s of audio) and
Pipecat's Smart Turn v3 (agent/smart_turn.py: the last 8 s) run in livekit-agents' *inference
process*, one per agent worker, instead of in every call's job process, whose memory would
otherwise carry their weights. A call's detector sends the turn's audio over the job's channel
when it wants a prediction, which livekit-agents' own stream asks for after 0.2 s of silence in
speech; `AGENT_TURN_DETECTOR` says which model answers (or both, combined).

The decision. livekit-agents reads a prediction as yes or no: at or above its threshold the
turn ends `min_delay` after the last speech, below it `max_delay` after. Here the score sets
how much silence the turn needs (`TurnPolicy.wait_s`): a sure end commits after the minimum
delay, an unsure one after the unsure delay (longer than a hesitation, shorter than the
maximum), the wait shortening as the score rises between the two, and only a very unlikely
one waits the maximum.
The stream answers the framework only when that silence is over (a "yes"), or at once with a
"no" for the maximum; speech before then withdraws the question, so a caller who resumes
inside the wait never had a turn committed. A speculative reply started at the end of speech
(the plugin's) is computed meanwhile and plays only once the turn is committed.
"""

from __future__ import annotations

import asyncio
import logging
import math
import os
import struct
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
from livekit import rtc
from livekit.agents import inference
from livekit.agents.inference.eot.base import MIN_SILENCE_DURATION_MS, _BaseStreamingTurnDetectorStream
from livekit.agents.inference_runner import _InferenceRunner
from livekit.agents.ipc.inference_executor import InferenceExecutor
from livekit.agents.types import DEFAULT_API_CONNECT_OPTIONS, APIConnectOptions
from livekit.local_inference import EOT_MAX_SAMPLES

from agent import smart_turn

log = logging.getLogger("omni-agent.turn-detector")

METHOD = "omni_agent.end_of_turn"
Detector = Literal["v1-mini", "smart-turn", "combined"]
DETECTORS: tuple[Detector, ...] = ("v1-mini", "smart-turn", "combined")
V1_MINI, SMART_TURN = 1, 2  # the request's first byte: which models to run
# the framework asks this long into the silence: the speech ended about this long before
ASKED_AFTER_S = MIN_SILENCE_DURATION_MS / 1000


def models_of(detector: Detector) -> int:
    return {"v1-mini": V1_MINI, "smart-turn": SMART_TURN, "combined": V1_MINI | SMART_TURN}[detector]


def request(models: int, pcm: bytes) -> bytes:
    return bytes([models]) + pcm


class EndOfTurnRunner(_InferenceRunner):
    """In the inference process: a byte saying which models, then 16 kHz PCM16 (the turn's last
    8 s at most) in; P(turn over) of v1-mini and of Smart Turn out, two float32 (NaN for a model
    not asked). Requests come from all calls at once, on the process's thread pool: one instance
    of each model per thread (v1-mini's share their weights)."""

    INFERENCE_METHOD = METHOD

    def initialize(self) -> None:
        from livekit.local_inference import init_eot

        init_eot()
        self._local = threading.local()
        if os.environ.get("AGENT_TURN_DETECTOR", "v1-mini") != "v1-mini":
            # loaded before the first call, not inside its first turn
            self._local.smart_turn = smart_turn.SmartTurn()

    def run(self, data: bytes) -> bytes | None:
        models = data[0]
        pcm = np.frombuffer(data[1:], dtype=np.int16)
        v1 = st = math.nan
        if models & V1_MINI:
            if not hasattr(self._local, "eot"):
                from livekit.local_inference import EOT

                self._local.eot = EOT()
            v1 = self._local.eot.predict(pcm[-EOT_MAX_SAMPLES:])
        if models & SMART_TURN:
            if not hasattr(self._local, "smart_turn"):
                self._local.smart_turn = smart_turn.SmartTurn()
            st = self._local.smart_turn.predict(pcm)
        return struct.pack("<ff", v1, st)


@dataclass(frozen=True)
class Scores:
    v1_mini: float | None
    smart_turn: float | None


def combined_score(v1: float, st: float) -> float:
    """Both models' views in one probability: their log-odds added, Smart Turn's at a quarter
    weight (v1-mini separates this project's benchmark's pauses from its ends better; Smart
    Turn adds its say mostly where it is very sure, which its log-odds are large for)."""
    return _sigmoid(_logit(v1) + 0.25 * _logit(st))


def _logit(p: float) -> float:
    p = min(max(p, 1e-4), 1 - 1e-4)
    return math.log(p / (1 - p))


def _sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


@dataclass(frozen=True)
class TurnPolicy:
    """How the detector's score becomes a wait: the silence after the last speech before the
    turn is committed. At or above `sure`: `min_delay_s`. Down to `unsure`: from there up to
    `unsure_delay_s`, as the score falls. Below that, `unsure_delay_s`: the longest pause inside a
    sentence the agent rides out when the models cannot tell. At or below `unlikely`:
    `max_delay_s`. With `sure` == `unsure` == `unlikely` it is livekit-agents' own reading of
    one threshold (the minimum delay or the maximum)."""

    detector: Detector
    min_delay_s: float
    max_delay_s: float
    unsure_delay_s: float
    sure: float
    unsure: float
    unlikely: float

    def score(self, scores: Scores) -> float:
        if self.detector == "v1-mini":
            return scores.v1_mini if scores.v1_mini is not None else 0.0
        if self.detector == "smart-turn":
            return scores.smart_turn if scores.smart_turn is not None else 0.0
        if scores.v1_mini is None or scores.smart_turn is None:
            return 0.0
        return combined_score(scores.v1_mini, scores.smart_turn)

    def wait_s(self, score: float) -> float:
        if score >= self.sure:
            return self.min_delay_s
        if score <= self.unlikely:
            return self.max_delay_s
        if score <= self.unsure:
            return self.unsure_delay_s
        share = (score - self.unsure) / (self.sure - self.unsure)
        return self.unsure_delay_s - (self.unsure_delay_s - self.min_delay_s) * share


# Per detector (sure, unsure, unlikely): where its scores put this project's benchmark's real
# ends and its mid-sentence pauses (`python -m bench.turns --score`; docs/agent.md, "How the turn is
# decided"): above `unsure` lie a fifth of the real ends and hardly any pause.
DEFAULT_THRESHOLDS: dict[Detector, tuple[float, float, float]] = {
    "v1-mini": (0.65, 0.45, 0.01),
    "smart-turn": (0.99, 0.9, 0.005),
    "combined": (0.74, 0.5, 0.005),
}


@dataclass(frozen=True)
class TurnDecision:
    """What a turn's decision was made of, for the room's `turn_decision` event."""

    detector: Detector
    scores: Scores
    score: float
    wait_s: float
    inference_s: float


class SharedTurnDetector(inference.TurnDetector):
    """livekit-agents' `TurnDetector(version="v1-mini")`, its predictions made in the inference
    process by `EndOfTurnRunner` with the models `policy.detector` names, and its answers
    given when `policy` says the turn is over."""

    def __init__(self, executor: InferenceExecutor, policy: TurnPolicy | None = None) -> None:
        super().__init__(version="v1-mini")
        self._executor = executor
        self.policy = policy or TurnPolicy("v1-mini", 0.25, 2.5, 1.3, *DEFAULT_THRESHOLDS["v1-mini"])
        self.on_decision: Callable[[TurnDecision], None] | None = None
        # True while the caller speaks over a reply (agent/barge_in.py): that turn is answered
        # after the minimum delay whatever the score, as before the wait was adaptive, so the
        # paused reply is cut and the barge-in answered before the false-interruption timeout
        # could resume the reply
        self.barging_in: Callable[[], bool] | None = None

    def stream(self, *, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS) -> _BaseStreamingTurnDetectorStream:
        return _DecidingStream(detector=self, opts=self._opts, transport=_RemoteModel(self), model=self.model)


class _DecidingStream(_BaseStreamingTurnDetectorStream):
    @property
    def prediction_timeout(self) -> float:
        # the answer comes when the wait is over, up to the maximum delay after the question
        return self._detector.policy.max_delay_s + 1.0  # type: ignore[attr-defined]


class _RemoteModel:
    """The stream's transport (livekit-agents' `_LocalTransport`, with the models elsewhere):
    keeps the turn's last audio as the frames came, joined only when a prediction is asked."""

    def __init__(self, detector: SharedTurnDetector) -> None:
        self._detector = detector
        self._models = models_of(detector.policy.detector)
        self._keep = smart_turn.WINDOW_SAMPLES if self._models & SMART_TURN else EOT_MAX_SAMPLES
        self._frames: deque[bytes] = deque()
        self._samples = 0
        self._stream: weakref.ref[_BaseStreamingTurnDetectorStream] | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def session_id(self) -> str | None:
        return None

    def attach(self, stream: _BaseStreamingTurnDetectorStream) -> None:
        self._stream = weakref.ref(stream)

    def push_frame(self, frame: rtc.AudioFrame) -> None:
        self._frames.append(bytes(frame.data))
        self._samples += frame.samples_per_channel
        while self._samples - len(self._frames[0]) // 2 >= self._keep:
            self._samples -= len(self._frames.popleft()) // 2

    def flush(self) -> None:
        self._frames.clear()
        self._samples = 0

    def run_inference(self, request_id: str) -> None:
        pcm = b"".join(self._frames)[-2 * self._keep:]
        task = asyncio.create_task(self._decide(request_id, pcm, speech_ended=time.monotonic() - ASKED_AFTER_S))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _decide(self, request_id: str, pcm: bytes, speech_ended: float) -> None:
        policy = self._detector.policy
        started = time.monotonic()
        scores = Scores(None, None)
        try:
            answer = await self._detector._executor.do_inference(METHOD, request(self._models, pcm))
            if answer is not None:
                v1, st = struct.unpack("<ff", answer)
                scores = Scores(None if math.isnan(v1) else v1, None if math.isnan(st) else st)
        except Exception:
            # as livekit-agents' own transport: a failed prediction is "not the end"
            log.exception("end-of-turn prediction failed")
        inference_s = time.monotonic() - started
        score = policy.score(scores)
        wait_s = policy.wait_s(score)
        if self._detector.barging_in is not None and self._detector.barging_in():
            wait_s = policy.min_delay_s
        stream = self._live_stream(request_id)
        if stream is None:
            return  # the caller spoke again before the models answered
        if self._detector.on_decision is not None:
            self._detector.on_decision(TurnDecision(policy.detector, scores, score, wait_s, inference_s))
        if wait_s >= policy.max_delay_s:
            # "not the end": the framework waits its maximum delay itself
            stream._resolve_prediction(request_id, 0.0, inference_duration=inference_s)
            return
        if wait_s > policy.min_delay_s:
            await asyncio.sleep(max(0.0, speech_ended + wait_s - time.monotonic()))
            if (stream := self._live_stream(request_id)) is None:
                return  # the caller went on inside the wait: no turn
        # "the end", now: the framework commits at once (or at its minimum delay, if sooner)
        stream._resolve_prediction(request_id, 1.0, inference_duration=inference_s)

    def _live_stream(self, request_id: str) -> _BaseStreamingTurnDetectorStream | None:
        """The stream, while this request is still the question it waits on."""
        stream = self._stream() if self._stream is not None else None
        if stream is None or stream._request_id != request_id:
            return None
        return stream

    def detach(self) -> None:
        for task in self._tasks:
            task.cancel()
        self._tasks.clear()

    async def run(self) -> None:
        stream = self._stream() if self._stream is not None else None
        if stream is not None:
            await stream._drain_audio_channel()


def register() -> None:
    """Before the worker starts (the main thread of the main process): livekit-agents starts
    its inference process only when a runner is registered."""
    if METHOD not in _InferenceRunner.registered_runners:
        _InferenceRunner.register_runner(EndOfTurnRunner)
