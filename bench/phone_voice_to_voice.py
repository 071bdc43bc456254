"""Voice to voice over the phone, measured at the phone.

A SIP phone (baresip, tests/e2e/phone.py) calls the agent through LiveKit's SIP service on
loopback, G.711 at 8 kHz, and says one question per call (the natural-speech test clips,
tests/data); the call's audio file then holds a few seconds of silence while it listens, and
the phone hangs up at its end. From the phone's own recordings:

    voice to voice = first voiced 20 ms of what the phone heard − the end of its question

(both recordings placed on the wall clock by baresip's log lines; a call whose recordings do
not line up within 0.3 s is reported and left out; the phone holds 40-80 ms of RTP in its
jitter buffer, as a desk phone does). Each call is a new room and a new job. Next to it, the
agent's own voice to voice (its log's `turn` line: end of speech to its first audio frame out
to the room), so the difference is the phone path: LiveKit, LiveKit SIP, RTP, the phone's
jitter buffer. The load average is printed too: the machine is shared.

It starts its own stack (Redis 17479, LiveKit 17990-17992, LiveKit SIP 17160 with RTP
17500-17599, the omni worker on tiny-random at 18340, the agent in start mode as `omni-agent`)
and provisions deploy/sip/'s trunk and rule, accepting 127.0.0.1.

    python -m bench.phone_voice_to_voice --calls 12
    python -m bench.phone_voice_to_voice --calls 12 --codec PCMA --out bench/results/phone.txt
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import platform
import re
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from deploy.sip.provision import provision_at, rule_request, trunk_request
from scripts.stack import (
    REPO,
    TINY_RANDOM_REPLY,
    Stack,
    livekit_server,
    livekit_sip,
    omni_worker,
    redis_server,
    voice_agent,
)
from tests.e2e.caller import load_wav
from tests.e2e.phone import Phone, Script

QUESTIONS = ["e2e_q1_time.wav", "e2e_q2_weather.wav", "e2e_q3_recall.wav", "e2e_q4_thanks.wav"]
REDIS, LIVEKIT, SIP, RTP, WORKER = 17479, 17990, 17160, (17500, 17599), 18340
TRUNK_NUMBER = "+15105550100"
DIAL = f"sip:{TRUNK_NUMBER}@127.0.0.1:{SIP}"  # what the phone calls: the trunk's number


def start_phone_line(stack: Stack, *, worker_args: tuple[str, ...] = TINY_RANDOM_REPLY,
                     agent_env: dict[str, str] | None = None, agent_checkout: Path = REPO) -> str:
    """Redis, LiveKit, LiveKit SIP, the omni worker and the agent (start mode, as `omni-agent`)
    in `stack`, and deploy/sip/'s trunk and rule provisioned; returns LiveKit's URL.
    `agent_env` adds to (or overrides) the agent's settings here; `agent_checkout`: another
    copy's agent (scripts/stack.py's voice_agent)."""
    livekit_url = f"ws://127.0.0.1:{LIVEKIT}"
    stack.start(redis_server(REDIS))
    stack.start(livekit_server(LIVEKIT, LIVEKIT + 1, LIVEKIT + 2, redis_port=REDIS))
    stack.start(livekit_sip(livekit_url=livekit_url, redis_port=REDIS, sip_port=SIP, rtp_ports=RTP))
    stack.start(omni_worker(WORKER, extra_args=worker_args))
    stack.start(voice_agent(livekit_url=livekit_url, omni_url=f"ws://127.0.0.1:{WORKER}/v1/realtime",
                            mode="start", env={"AGENT_NAME": "omni-agent", "AGENT_GREETING": "",
                                               "AGENT_HTTP_PORT": "18341", "AGENT_METRICS_PORT": "18342",
                                               **(agent_env or {})},
                            checkout=agent_checkout))
    asyncio.run(provision_at(f"http://127.0.0.1:{LIVEKIT}", "devkey", "secret",
                             trunk=trunk_request(allowed_addresses=["127.0.0.1/32"]),
                             rule=rule_request(agent_name="omni-agent")))
    return livekit_url


def new_phone(workdir: Path, i: int, codec: str) -> Phone:
    """The phone of call `i`: a number of its own (so its room is told from the last call's)."""
    return Phone(workdir / f"call-{i}", number=f"+1555010{i:04d}", sip_port=17610, rtp_ports=(17612, 17615),
                 console_port=17616, codec=codec)


def one_call(workdir: Path, i: int, codec: str) -> tuple[float | None, str]:
    phone = new_phone(workdir, i, codec)
    script = Script().pause(1.5).say("question", load_wav(QUESTIONS[i % len(QUESTIONS)])).pause(4.0)
    try:
        phone.start(script, dial=DIAL)
        phone.wait_call_over(script.duration + 30)
        time.sleep(0.3)
        rec = phone.recording()
        if rec.aligned_within() > 0.3:
            return None, f"recordings off by {rec.aligned_within():.2f} s"
        _, q_end = script.marks["question"]
        first = rec.first_voice_after(q_end)
        if first is None:
            return None, "no agent audio"
        return first - q_end, "ok"
    finally:
        phone.stop()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--calls", type=int, default=12)
    p.add_argument("--codec", default="PCMU", choices=["PCMU", "PCMA"])
    p.add_argument("--out", type=Path, help="also write the report here (bench/results/...)")
    args = p.parse_args()

    workdir = Path(tempfile.mkdtemp(prefix="phone-bench-"))
    lines: list[str] = []

    def say(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    stack = Stack(echo=None, log_dir=workdir, say=lambda m: print(f"[stack] {m}", flush=True))
    samples: list[float] = []
    agent_samples: list[float] = []  # ms
    paths: list[float] = []  # ms: at the phone − the agent's own, call by call
    try:
        start_phone_line(stack)
        agent_turns = re.compile(r"turn 1: voice-to-voice (\d+) ms")
        seen = 0
        for i in range(args.calls):
            latency, outcome = one_call(workdir, i, args.codec)
            time.sleep(1.0)  # the job of the last call ends, a warm process waits again
            turns = [int(m.group(1)) for line in stack.processes["agent"].lines()
                     if (m := agent_turns.search(line))]
            agent_ms = turns[seen] if len(turns) > seen else None
            seen = len(turns)
            load = os.getloadavg()[0]
            say(f"call {i + 1}/{args.calls}: " + (f"{latency * 1000:.0f} ms" if latency is not None else outcome)
                + (f" (the agent's own {agent_ms} ms)" if agent_ms is not None else "") + f", load {load:.1f}")
            if latency is not None:
                samples.append(latency)
                if agent_ms is not None:
                    paths.append(latency * 1000 - agent_ms)
                    agent_samples.append(agent_ms)
    finally:
        stack.stop()

    if not samples:
        say("no call was measured")
        return 1
    ms = np.array(samples) * 1000
    say(f"phone voice to voice p50: {np.percentile(ms, 50):.0f} ms over {len(ms)} calls")
    say(f"p90 {np.percentile(ms, 90):.0f} ms, min {ms.min():.0f} ms, max {ms.max():.0f} ms; codec {args.codec} "
        f"(8 kHz), tiny-random on the CPU (reference engine), agent in start mode")
    if agent_samples:
        say(f"the agent's own voice to voice (to its audio out) p50 {np.percentile(agent_samples, 50):.0f} ms; "
            f"the phone path adds p50 {np.percentile(paths, 50):.0f} ms")
    say(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} cores; "
        f"{datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC")
    if args.out:
        args.out.write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
