"""The end-of-turn model, once per agent worker instead of once per call.

livekit-agents 1.8 runs its local audio turn detector (`v1-mini`) in each call's job process:
the forkserver loads the weights (~250 MB resident) and every job process inherits them, so
each one's RSS carries them. Here the model runs in livekit-agents' inference process instead
(one per agent worker; the framework starts it for registered inference runners, which is what
they are for), and a call's detector sends it the last 1.2 s of audio over the job's channel to
the worker when it wants a prediction. The detector itself is livekit-agents' own: its stream
decides when to ask (after 0.2 s of silence in speech) and what the answer means (its
thresholds); only where the model runs, and how the audio it needs is kept, differ.
"""

from __future__ import annotations

import asyncio
import logging
import struct
import threading
import time
import weakref
from collections import deque

import numpy as np
from livekit import rtc
from livekit.agents import inference
from livekit.agents.inference.eot.base import _BaseStreamingTurnDetectorStream
from livekit.agents.inference_runner import _InferenceRunner
from livekit.agents.ipc.inference_executor import InferenceExecutor
from livekit.agents.types import DEFAULT_API_CONNECT_OPTIONS, APIConnectOptions
from livekit.local_inference import EOT_MAX_SAMPLES

log = logging.getLogger("omni-agent.turn-detector")

METHOD = "omni_agent.end_of_turn"


class EndOfTurnRunner(_InferenceRunner):
    """In the inference process: 16 kHz PCM16 (up to 1.2 s) in, P(turn ended) out as a float32.
    Requests come from all calls at once, on the process's thread pool: one model instance per
    thread (they share the weights)."""

    INFERENCE_METHOD = METHOD

    def initialize(self) -> None:
        from livekit.local_inference import init_eot

        init_eot()
        self._local = threading.local()

    def run(self, data: bytes) -> bytes | None:
        if not hasattr(self._local, "eot"):
            from livekit.local_inference import EOT

            self._local.eot = EOT()
        pcm = np.frombuffer(data, dtype=np.int16)
        return struct.pack("<f", self._local.eot.predict(pcm))


class SharedTurnDetector(inference.TurnDetector):
    """`TurnDetector(version="v1-mini")` whose predictions are made by `EndOfTurnRunner`."""

    def __init__(self, executor: InferenceExecutor) -> None:
        super().__init__(version="v1-mini")
        self._executor = executor

    def stream(self, *, conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS) -> _BaseStreamingTurnDetectorStream:
        return _BaseStreamingTurnDetectorStream(detector=self, opts=self._opts, transport=_RemoteModel(self._executor),
                                                model=self.model)


class _RemoteModel:
    """The stream's transport (livekit-agents' `_LocalTransport`, with the model elsewhere):
    keeps the last 1.2 s of audio as the frames came, joined only when a prediction is asked."""

    def __init__(self, executor: InferenceExecutor) -> None:
        self._executor = executor
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
        while self._samples - len(self._frames[0]) // 2 >= EOT_MAX_SAMPLES:
            self._samples -= len(self._frames.popleft()) // 2

    def flush(self) -> None:
        self._frames.clear()
        self._samples = 0

    def run_inference(self, request_id: str) -> None:
        pcm = b"".join(self._frames)[-2 * EOT_MAX_SAMPLES:]
        task = asyncio.create_task(self._predict(request_id, pcm))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _predict(self, request_id: str, pcm: bytes) -> None:
        probability = 0.0  # as livekit-agents' own transport: a failed prediction is "not the end"
        started = time.monotonic()
        try:
            answer = await self._executor.do_inference(METHOD, pcm)
            if answer is not None:
                probability = struct.unpack("<f", answer)[0]
        except Exception:
            log.exception("end-of-turn prediction failed")
        stream = self._stream() if self._stream is not None else None
        if stream is not None:
            stream._resolve_prediction(request_id, probability, inference_duration=time.monotonic() - started)

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

