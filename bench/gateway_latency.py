"""How much latency does the gateway add? Per audio chunk, and to the first audio.

The worker runs in a thread of this process (its own event loop) over the real engine,
wrapped so each audio delta is stamped when the engine yields it; a client on the main loop
stamps each `response.output_audio.delta` when it arrives. Both use time.perf_counter, so

  per-chunk gateway latency = client arrival - engine yield   (JSON, base64, socket, loops)
  first-audio overhead      = client time to first audio - engine time to first audio

With `--engine null` the engine yields precomputed chunks at once: what is left is the
gateway's own cost. Results go to stdout with the machine and the date.

  python -m bench.gateway_latency --engine reference --model tiny-random --turns 10
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import platform
import threading
import time
from typing import AsyncIterator

import numpy as np
from aiohttp import web

from inference import engine as eng
from inference.config import WorkerSettings
from inference.server import Worker
from bench.null_worker import NullEngine
from tests.support.realtime_client import RealtimeClient, speech_like


class StampingEngine(eng.OmniEngine):
    """Wraps an engine; remembers when each audio delta left it."""

    def __init__(self, inner: eng.OmniEngine) -> None:
        super().__init__(inner.model)
        self.inner, self.name, self.voices = inner, inner.name, inner.voices
        self.stamps: list[float] = []
        self.first_audio_s: list[float] = []

    async def start(self) -> None:
        await self.inner.start()

    async def generate(self, request: eng.GenerationRequest) -> AsyncIterator[eng.Delta]:
        t0 = time.perf_counter()
        first = True
        async for delta in self.inner.generate(request):
            if isinstance(delta, eng.AudioDelta) and delta.audio.size:
                now = time.perf_counter()
                if first:
                    self.first_audio_s.append(now - t0)
                    first = False
                self.stamps.append(now)
            yield delta


def run_worker(engine: eng.OmniEngine, port: int, ready: threading.Event) -> None:
    async def main() -> None:
        worker = Worker(WorkerSettings(api_key="bench", port=port), engine)
        await engine.start()
        worker.state = "ready"
        runner = web.AppRunner(worker.app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        ready.set()
        await asyncio.Event().wait()

    asyncio.run(main())


def pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) * 1000 if values else float("nan")


async def bench(url: str, engine: StampingEngine, turns: int, max_tokens: int) -> None:
    arrivals: list[float] = []
    ttfa: list[float] = []
    async with await RealtimeClient.connect(url, "bench") as client:
        for turn in range(turns + 1):  # turn 0 warms the path and is not counted
            await client.append_audio(speech_like(1.5, seed=turn))
            await client.send("input_audio_buffer.commit")
            await client.wait_for("conversation.item.done")
            start_stamps = len(engine.stamps)
            t0 = time.perf_counter()
            await client.send("response.create", response={"max_output_tokens": max_tokens})
            first = None
            turn_arrivals = []
            while True:
                event = await client.recv()
                if event["type"] == "response.output_audio.delta":
                    now = time.perf_counter()
                    first = first or now
                    turn_arrivals.append(now)
                elif event["type"] == "response.done":
                    break
            if turn == 0:
                engine.first_audio_s.clear()
                continue
            if first is not None:
                ttfa.append(first - t0)
            arrivals.extend(a - s for a, s in zip(turn_arrivals, engine.stamps[start_stamps:]))
    overhead = [c - e for c, e in zip(ttfa, engine.first_audio_s)]
    print(f"audio chunks measured: {len(arrivals)} over {turns} turns")
    print(f"gateway latency per audio chunk (engine yield -> client receive): "
          f"p50 {pct(arrivals, 50):.2f} ms, p95 {pct(arrivals, 95):.2f} ms, max {pct(arrivals, 100):.2f} ms")
    print(f"time to first audio at the client: p50 {pct(ttfa, 50):.1f} ms, p95 {pct(ttfa, 95):.1f} ms")
    print(f"  of which engine (request -> first audio yielded): p50 {pct(engine.first_audio_s, 50):.1f} ms")
    print(f"  gateway overhead on first audio: p50 {pct(overhead, 50):.2f} ms, p95 {pct(overhead, 95):.2f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--engine", choices=["reference", "null"], default="reference")
    parser.add_argument("--model", default="tiny-random")
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--max-output-tokens", type=int, default=24)
    parser.add_argument("--port", type=int, default=18765)
    parser.add_argument("--min-audio-seconds", type=float, default=2.0,
                        help="reference engine: speech per reply at least (a random talker may stop early)")
    args = parser.parse_args()

    inner = NullEngine() if args.engine == "null" else eng.create_engine(
        "reference", args.model, min_audio_seconds=args.min_audio_seconds)
    engine = StampingEngine(inner)
    ready = threading.Event()
    threading.Thread(target=run_worker, args=(engine, args.port, ready), daemon=True).start()
    if not ready.wait(600):
        raise SystemExit("worker did not start")
    print(f"# gateway latency bench — {datetime.date.today()} — {platform.node()} "
          f"({platform.processor() or platform.machine()}, {os.cpu_count()} cores), python {platform.python_version()}")
    print(f"# engine {args.engine}, model {args.model}")
    asyncio.run(bench(f"ws://127.0.0.1:{args.port}/v1/realtime", engine, args.turns, args.max_output_tokens))


if __name__ == "__main__":
    main()
