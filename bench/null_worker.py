"""An omni worker with no model: the real gateway (inference.server) over an engine that
answers every request with a tone, for benchmarks that measure everything *but* the model.

`python -m bench.gateway_latency --engine null` uses the engine in its own process (unpaced: what is
left is the gateway's own cost); `bench/agent_cost.py` starts this as the worker its agent talks
to (paced like a GPU, so the agent's share of a call's CPU is not mixed with a model's):

    python -m bench.null_worker --port 8000 --reply-seconds 4 --rtf 0.5
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import sys
from typing import AsyncIterator

import numpy as np

from inference import engine as eng
from scripts.stack import Service


class NullEngine(eng.OmniEngine):
    """A reply is `reply_s` of a 24 kHz tone in `chunk_s` chunks, each with a word of text,
    one every `chunk_s * rtf` seconds (0: as fast as the gateway takes them). Text-only
    requests (transcribing a user turn) get a few words at once."""

    name = "null"

    def __init__(self, model: str = "null", *, reply_s: float = 3.2, chunk_s: float = 0.08,
                 rtf: float = 0.0) -> None:
        super().__init__(model)
        self._chunks = round(reply_s / chunk_s)
        self._pause_s = chunk_s * rtf
        n = round(chunk_s * eng.OUTPUT_SAMPLE_RATE)
        self._chunk = (0.1 * np.sin(np.arange(n) / 10)).astype(np.float32)

    async def start(self) -> None:
        pass

    async def generate(self, request: eng.GenerationRequest) -> AsyncIterator[eng.Delta]:
        if "audio" not in request.modalities:
            yield eng.TextDelta("what the user said")
            yield eng.Finished(output_text_tokens=4)
            return
        for _ in range(self._chunks):
            yield eng.TextDelta("word ")
            yield eng.AudioDelta(self._chunk)
            await asyncio.sleep(self._pause_s)
        yield eng.Finished(output_text_tokens=self._chunks, output_audio_tokens=10 * self._chunks)


def service(port: int, *, reply_seconds: float = 4.0) -> Service:
    """This worker as a part of a `scripts.stack.Stack`."""
    return Service(name="worker", argv=[sys.executable, "-m", "bench.null_worker", "--port", str(port),
                                        "--reply-seconds", str(reply_seconds)],
                   ready_url=f"http://127.0.0.1:{port}/health", tcp_ports=(port,))


def main() -> int:
    from inference.config import Limits, WorkerSettings
    from inference.server import serve

    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--port", type=int, required=True)
    p.add_argument("--max-sessions", type=int, default=64)
    p.add_argument("--reply-seconds", type=float, default=4.0)
    p.add_argument("--chunk-seconds", type=float, default=0.24, help="audio per delta (the reference engine's)")
    p.add_argument("--rtf", type=float, default=0.5, help="generation time per second of audio")
    args = p.parse_args()
    logging.basicConfig(level="INFO", format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    engine = NullEngine(reply_s=args.reply_seconds, chunk_s=args.chunk_seconds, rtf=args.rtf)
    settings = WorkerSettings(host="127.0.0.1", port=args.port, insecure_no_auth=True,
                              limits=Limits(max_sessions=args.max_sessions))
    return asyncio.run(serve(settings, engine))


if __name__ == "__main__":
    raise SystemExit(main())
