"""A long call on one session: does it keep answering, and does the worker's memory stay flat?

Starts `python -m inference serve` on tiny-random with the worker's own defaults (plus any
`--engine-option`s given) and talks to it as an OpenAI Realtime client does (24 kHz input, no
turn detection, about 3 s of festival speech a turn, `response.create` after each;
tests/support/spoken_turns.py) for `--turns` turns. Per turn it prints the reply's status, the
prompt tokens the model read and how many came from the prefix cache, where the model's
reading started (truncation), the reply's audio, the time from `response.create` to
`response.done`, and the worker's RSS; then a summary.

  python -m bench.long_call --turns 60
  python -m bench.long_call --turns 40 --truncation retention_ratio=0.8
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import platform
import tempfile
import time
from pathlib import Path

import psutil

from tests.conftest import WorkerProcess
from tests.support.spoken_turns import TURN_S, openai_like_client, spoken_turn


def truncation(value: str) -> str | dict:
    if value in ("auto", "disabled"):
        return value
    name, _, ratio = value.partition("=")
    if name != "retention_ratio" or not ratio:
        raise argparse.ArgumentTypeError("auto, disabled or retention_ratio=R")
    return {"type": "retention_ratio", "retention_ratio": float(ratio)}


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--turns", type=int, default=60)
    parser.add_argument("--truncation", type=truncation, default="auto")
    parser.add_argument("--engine-option", action="append", default=[], metavar="KEY=VALUE")
    args = parser.parse_args()
    options = tuple(arg for option in args.engine_option for arg in ("--engine-option", option))
    print(f"# long call bench — {datetime.date.today()} — {platform.node()} ({platform.machine()}, "
          f"{os.cpu_count()} cores), python {platform.python_version()}; tiny-random, engine options "
          f"{args.engine_option or 'the defaults'}, truncation {args.truncation}, {args.turns} turns of {TURN_S:g} s")
    with tempfile.TemporaryDirectory() as tmp:
        worker = WorkerProcess(Path(tmp), engine_args=(), args=options).start()
        process = psutil.Process(worker.proc.pid)
        rss, statuses, cuts = [], [], []
        try:
            async with await openai_like_client(worker, truncation=args.truncation) as client:
                start = None
                print("turn  status      input  cached  start moved  audio_s  reply_s  rss_mb")
                for turn in range(1, args.turns + 1):
                    began = time.perf_counter()
                    done = await spoken_turn(client, turn - 1)
                    took = time.perf_counter() - began
                    rss.append(process.memory_info().rss / 2**20)
                    usage = done.get("usage") or {}
                    moved = start is not None and done["context_start_item_id"] != start
                    start = done["context_start_item_id"]
                    statuses.append(done["status"])
                    if moved:
                        cuts.append(turn)
                    print(f"{turn:4d}  {done['status']:10s}  {usage.get('input_tokens', 0):5d}  "
                          f"{(usage.get('input_token_details') or {}).get('cached_tokens', 0):6d}  "
                          f"{'yes' if moved else '':11s}  {done['audio_s']:7.2f}  {took:7.2f}  {rss[-1]:6.0f}")
        finally:
            worker.stop()
    failed = sum(status == "failed" for status in statuses)
    moved = ", ".join(map(str, cuts[:12])) + (", …" if len(cuts) > 12 else "")
    print(f"answered {len(statuses) - failed} of {len(statuses)} turns ({failed} failed); the model's context "
          f"start moved {len(cuts)} times, at turns {moved or 'none'}")
    half = len(rss) // 2
    first_cut = f"{rss[cuts[0] - 1]:.0f} MB at the first cut (turn {cuts[0]}), " if cuts else "(the context never filled) "
    print(f"worker RSS: {rss[0]:.0f} MB after turn 1, {first_cut}{rss[half - 1]:.0f} MB at turn {half}, "
          f"{rss[-1]:.0f} MB at turn {len(rss)}: {rss[-1] - rss[half - 1]:+.0f} MB over the second half, "
          f"{max(rss) - rss[0]:+.0f} MB at most over the call")


if __name__ == "__main__":
    asyncio.run(main())
