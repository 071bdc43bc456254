"""What does the provider plugin cost? CPU per second of audio, and latency added per frame.

The plugin's RealtimeSession runs on the main event loop against a stand-in worker that lives
in its own thread and loop (a minimal realtime endpoint: it stamps what arrives and streams a
scripted reply). The CPU time of the main thread is therefore the plugin's own work: resampling,
chunking, base64, JSON and socket I/O, and the event loop around them.

  input  CPU: push N s of room audio (24 kHz, 20 ms frames) as fast as possible, until the
         endpoint has all of it; main-thread CPU per second of audio.
  output CPU: the endpoint streams N s of 24 kHz reply audio as fast as possible; the main
         thread decodes it into frames and drains the streams.
  input  latency: frames pushed in real time; push_audio() of the frame that completes an
         append chunk → that append read by the endpoint.
  output latency: deltas sent in real time; the endpoint writes a delta → its frame comes out
         of the generation's audio stream.

  python -m bench.provider_cost --seconds 60 --latency-seconds 10
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import datetime
import json
import os
import platform
import statistics
import threading
import time

import numpy as np
from aiohttp import web
from livekit import rtc
from livekit.plugins.omni import RealtimeModel, RealtimeSession
from livekit.plugins.omni.audio import APPEND_CHUNK_SAMPLES, INPUT_SAMPLE_RATE
from tests.conftest import free_port

ROOM_RATE = 24_000
FRAME_SAMPLES = ROOM_RATE // 50  # 20 ms


class StandInWorker(threading.Thread):
    """A realtime endpoint in its own thread: stamps appends, streams a scripted reply."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.port = free_port()
        self.append_times: list[float] = []
        self.appended_bytes = 0
        self.delta_times: list[float] = []
        self.reply_seconds = 0.0
        self.reply_delta_ms = 100
        self.reply_paced = False
        self.ready = threading.Event()
        self.loop: asyncio.AbstractEventLoop | None = None

    def run(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.loop.run_until_complete(self._serve())
        self.ready.set()
        self.loop.run_forever()

    async def _serve(self) -> None:
        app = web.Application()
        app.router.add_get("/v1/realtime", self._realtime)
        runner = web.AppRunner(app, access_log=None)
        await runner.setup()
        await web.TCPSite(runner, "127.0.0.1", self.port).start()

    async def _realtime(self, request: web.Request) -> web.WebSocketResponse:
        ws = web.WebSocketResponse(max_msg_size=0)
        await ws.prepare(request)
        await ws.send_json({"type": "session.created", "session": {}})
        async for msg in ws:
            event = json.loads(msg.data)
            if event["type"] == "input_audio_buffer.append":
                self.append_times.append(time.perf_counter())
                self.appended_bytes += len(base64.b64decode(event["audio"]))
            elif event["type"] == "session.update":
                await ws.send_json({"type": "session.updated", "session": {}})
            elif event["type"] == "response.create":
                await self._reply(ws, event)
        return ws

    async def _reply(self, ws: web.WebSocketResponse, create: dict) -> None:
        rid, iid = "resp_bench", f"item_{len(self.delta_times)}"
        samples = ROOM_RATE * self.reply_delta_ms // 1000
        chunk = base64.b64encode((1000 * np.sin(np.arange(samples) / 8)).astype(np.int16).tobytes()).decode()
        ids = {"response_id": rid, "item_id": iid, "output_index": 0, "content_index": 0}
        item = {"id": iid, "type": "message", "role": "assistant", "content": [{"type": "output_audio", "transcript": ""}]}
        await ws.send_json({"type": "response.created", "response": {"id": rid, "metadata": create["response"]["metadata"]}})
        await ws.send_json({"type": "response.output_item.added", "response_id": rid, "output_index": 0, "item": item})
        await ws.send_json({"type": "conversation.item.added", "previous_item_id": None, "item": item})
        await ws.send_json({"type": "response.content_part.added", **ids, "part": {"type": "audio"}})
        started = time.perf_counter()
        for i in range(int(self.reply_seconds * 1000 / self.reply_delta_ms)):
            if self.reply_paced:
                await asyncio.sleep(max(0.0, started + i * self.reply_delta_ms / 1000 - time.perf_counter()))
            await ws.send_json({"type": "response.output_audio_transcript.delta", **ids, "delta": "word "})
            self.delta_times.append(time.perf_counter())
            await ws.send_str(json.dumps({"type": "response.output_audio.delta", **ids, "delta": chunk}))
        await ws.send_json({"type": "response.output_item.done", "response_id": rid, "output_index": 0, "item": item})
        await ws.send_json({"type": "response.done", "response": {"id": rid, "status": "completed", "output": [item]}})


def room_frames(seconds: float, rate: int = ROOM_RATE) -> list[rtc.AudioFrame]:
    n = rate // 50
    t = np.arange(int(seconds * rate)) / rate
    pcm = (3000 * np.sin(2 * np.pi * 200 * t)).astype(np.int16)
    return [rtc.AudioFrame(pcm[i:i + n].tobytes(), rate, 1, n) for i in range(0, len(pcm) - n + 1, n)]


async def wait_until(condition, timeout: float = 120) -> None:
    deadline = time.perf_counter() + timeout
    while not condition():
        if time.perf_counter() > deadline:
            raise TimeoutError("the stand-in worker did not get everything")
        await asyncio.sleep(0.001)


async def input_cpu(session: RealtimeSession, worker: StandInWorker, seconds: float, rate: int) -> float:
    frames = room_frames(seconds, rate)
    expected = worker.appended_bytes + int(seconds * 16000 * 2) - 2 * 16000 // 50  # within a frame
    cpu = time.thread_time()
    for frame in frames:
        session.push_audio(frame)
        await asyncio.sleep(0)  # let the sender run, as the agent's event loop would
    session.commit_audio()
    await wait_until(lambda: worker.appended_bytes >= expected)
    return (time.thread_time() - cpu) / seconds


async def output_cpu(session: RealtimeSession, worker: StandInWorker, seconds: float) -> float:
    worker.reply_seconds, worker.reply_paced = seconds, False
    cpu = time.thread_time()
    generation = await session.generate_reply()
    async for message in generation.message_stream:
        async for _ in message.text_stream:
            pass
        async for _ in message.audio_stream:
            pass
    return (time.thread_time() - cpu) / seconds


async def input_latency(session: RealtimeSession, worker: StandInWorker, seconds: float) -> list[float]:
    """Per append chunk: push_audio() of the frame that completed it → read by the endpoint."""
    pushed_at: list[float] = []  # one entry per chunk the plugin queued
    queue = session._send  # the bench needs to know which push produced which chunk

    def stamping_send(item):
        if isinstance(item, bytes):
            pushed_at.append(current_push)
        queue(item)

    session._send = stamping_send  # type: ignore[method-assign]
    first = len(worker.append_times)
    start = time.perf_counter()
    for i, frame in enumerate(room_frames(seconds)):
        await asyncio.sleep(max(0.0, start + i * 0.02 - time.perf_counter()))
        current_push = time.perf_counter()
        session.push_audio(frame)
    await wait_until(lambda: len(worker.append_times) - first >= len(pushed_at))
    session._send = queue  # type: ignore[method-assign]
    return [arrived - pushed for pushed, arrived in zip(pushed_at, worker.append_times[first:])]


async def output_latency(session: RealtimeSession, worker: StandInWorker, seconds: float) -> list[float]:
    """Per delta: the endpoint writes it → its frame leaves the generation's audio stream."""
    worker.reply_seconds, worker.reply_paced = seconds, True
    first = len(worker.delta_times)
    got: list[float] = []
    generation = await session.generate_reply()
    async for message in generation.message_stream:
        async def drain_text() -> None:
            async for _ in message.text_stream:
                pass

        text = asyncio.create_task(drain_text())
        async for _ in message.audio_stream:
            got.append(time.perf_counter())
        await text
    return [received - sent for sent, received in zip(worker.delta_times[first:], got)]


def ms(values: list[float], q: float) -> float:
    return 1000 * float(np.quantile(values, q))


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60.0, help="audio for the CPU measurements")
    parser.add_argument("--latency-seconds", type=float, default=10.0, help="real-time audio for the latency ones")
    args = parser.parse_args()

    worker = StandInWorker()
    worker.start()
    worker.ready.wait()
    model = RealtimeModel(url=f"ws://127.0.0.1:{worker.port}/v1/realtime")
    session = model.session()
    await asyncio.sleep(0.5)  # connected

    cpu_in_24 = await input_cpu(session, worker, args.seconds, 24_000)
    cpu_in_48 = await input_cpu(session, worker, args.seconds, 48_000)
    cpu_out = await output_cpu(session, worker, args.seconds)
    lat_in = await input_latency(session, worker, args.latency_seconds)
    lat_out = await output_latency(session, worker, args.latency_seconds)
    await session.aclose()
    await model.aclose()

    print(f"# provider plugin cost, {datetime.date.today()}, {platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} CPUs, python {platform.python_version()}")
    print(f"input  CPU, 24 kHz room audio: {100 * cpu_in_24:.2f} % of a core ({1000 * cpu_in_24:.1f} ms per audio second)")
    print(f"input  CPU, 48 kHz room audio: {100 * cpu_in_48:.2f} % of a core ({1000 * cpu_in_48:.1f} ms per audio second)")
    print(f"output CPU, 24 kHz reply audio in {worker.reply_delta_ms} ms deltas: {100 * cpu_out:.2f} % of a core "
          f"({1000 * cpu_out:.1f} ms per audio second)")
    print(f"input  latency per append chunk (n={len(lat_in)}): p50 {ms(lat_in, 0.5):.2f} ms, "
          f"p95 {ms(lat_in, 0.95):.2f} ms, max {1000 * max(lat_in):.2f} ms "
          f"(plus up to {1000 * APPEND_CHUNK_SAMPLES / INPUT_SAMPLE_RATE:.0f} ms waiting for a chunk to fill; a commit flushes it)")
    print(f"output latency per frame (n={len(lat_out)}): p50 {ms(lat_out, 0.5):.2f} ms, "
          f"p95 {ms(lat_out, 0.95):.2f} ms, max {1000 * max(lat_out):.2f} ms")
    print(f"mean input latency {1000 * statistics.fmean(lat_in):.2f} ms, output {1000 * statistics.fmean(lat_out):.2f} ms")


if __name__ == "__main__":
    asyncio.run(main())
