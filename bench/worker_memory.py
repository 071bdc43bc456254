"""Memory of the gateway per open session: RSS of a worker process with N idle sessions.

Starts `python -m inference serve` on tiny-random (the engine's own memory is the same with
or without sessions), measures its resident memory, opens N sessions that each configure
themselves and hold one committed second of user audio, and measures again.

  python -m bench.worker_memory --sessions 50
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import platform
import tempfile
from pathlib import Path

from tests.conftest import WorkerProcess
from tests.support.realtime_client import RealtimeClient, speech_like


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


async def open_sessions(worker: WorkerProcess, n: int) -> list[RealtimeClient]:
    clients = []
    for i in range(n):
        client = await RealtimeClient.connect(worker.url, worker.api_key)
        await client.update_session(instructions="You are a helpful voice assistant. " * 20)
        await client.append_audio(speech_like(1.0, seed=i))
        await client.send("input_audio_buffer.commit")
        await client.wait_for("conversation.item.done")
        clients.append(client)
    return clients


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=50)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        worker = WorkerProcess(Path(tmp), args=("--max-sessions", str(args.sessions + 1)),
                               # all sessions come from one address, faster than a real client would open them
                               env={"OMNI_LIMIT_CLIENT_CONNECTION_BURST": str(args.sessions + 10)}).start()
        try:
            await asyncio.sleep(1)
            before = rss_mb(worker.proc.pid)
            clients = await open_sessions(worker, args.sessions)
            await asyncio.sleep(1)
            after = rss_mb(worker.proc.pid)
            for client in clients:
                await client.close()
        finally:
            worker.stop()
    print(f"# worker memory bench — {datetime.date.today()} — {platform.node()} "
          f"({platform.machine()}, {os.cpu_count()} cores), python {platform.python_version()}")
    print(f"worker RSS idle: {before:.1f} MB; with {args.sessions} open sessions: {after:.1f} MB")
    print(f"gateway memory per open session: {(after - before) / args.sessions:.2f} MB")


if __name__ == "__main__":
    asyncio.run(main())
