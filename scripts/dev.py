"""The whole local stack in one command (run it as `./scripts/dev`).

1. LiveKit server (built from source into .tools/bin on first use), dev keys, loopback only.
2. Omni worker on `tiny-random` unless OMNI_MODEL names a model (and OMNI_ENGINE an engine).
3. The agent (`agent/agent.py dev`), registered with that LiveKit server.
4. The web page and its token endpoint (`scripts/web-serve`, which builds it with npm).

With --sip, a phone line too (docs/sip.md): Redis, the LiveKit server with Redis, LiveKit's SIP
service on 127.0.0.1 (SIP 5060 UDP/TCP, RTP 10000-10099), the trunk and the dispatch rule of
deploy/sip/ (accepting calls from 127.0.0.1 to its number), and the agent registered as
`omni-agent`, the name the rule dispatches (the web page's tokens ask for it too). Dial it with
any SIP phone on this machine, e.g. `baresip`: sip:+15105550100@127.0.0.1:5060.

Each part's output is shown with its name in front. When everything is up it prints the URL
to open. Ctrl-C stops every part, the last started first.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import signal
import subprocess
import sys
import time

from scripts.stack import (
    DEV_API_KEY,
    DEV_API_SECRET,
    REPO,
    Stack,
    StackError,
    find_livekit_server,
    find_livekit_sip,
    livekit_server,
    livekit_sip,
    omni_worker,
    redis_server,
    voice_agent,
    web_page,
)

PHONE_AGENT_NAME = "omni-agent"  # what deploy/sip/dispatch-rule.json dispatches

def say(message: str) -> None:
    print(f"[dev] {message}", flush=True)


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="scripts/dev", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=os.environ.get("OMNI_MODEL", "tiny-random"),
                   help="omni model: tiny-random, a local path or a Hugging Face id (env OMNI_MODEL)")
    p.add_argument("--engine", default=os.environ.get("OMNI_ENGINE", "reference"),
                   choices=["reference", "vllm-omni"], help="omni engine (env OMNI_ENGINE)")
    p.add_argument("--livekit-port", type=int, default=7880,
                   help="LiveKit signalling port; RTC uses the next two (TCP, then UDP)")
    p.add_argument("--worker-port", type=int, default=8000)
    p.add_argument("--web-port", type=int, default=8080)
    p.add_argument("--no-web", action="store_true", help="do not build or serve the web page")
    p.add_argument("--sip", action="store_true", help="a phone line: Redis, LiveKit SIP, deploy/sip/'s trunk and rules")
    p.add_argument("--sip-port", type=int, default=5060, help="LiveKit SIP's port on 127.0.0.1 (UDP and TCP)")
    p.add_argument("--redis-port", type=int, default=6379, help="the Redis that --sip starts (loopback)")
    return p.parse_args()


def ensure_livekit_server() -> None:
    if find_livekit_server() is not None:
        return
    say("no LiveKit server binary yet: building it from source (needs Go; a few minutes, once)")
    subprocess.run([str(REPO / "scripts" / "install-livekit-server.sh")], check=True)


def ensure_livekit_sip() -> None:
    if find_livekit_sip() is not None:
        return
    say("no LiveKit SIP binary yet: building it from ../shared/vendor (needs Go and libopus; once)")
    subprocess.run([str(REPO / "scripts" / "install-livekit-sip.sh")], check=True)


def provision_phone_line(livekit_url: str, agent_name: str) -> None:
    from deploy.sip.provision import http_url, provision_at, refuse_rule_request, rule_request, trunk_request

    done = asyncio.run(provision_at(http_url(livekit_url), DEV_API_KEY, DEV_API_SECRET,
                                    trunk=trunk_request(allowed_addresses=["127.0.0.1/32"]),
                                    rule=rule_request(agent_name=agent_name),
                                    refuse_rule=refuse_rule_request(agent_name=agent_name)))
    say(f"phone line: trunk {done.trunk_id} for {', '.join(done.numbers)}, rule {done.rule_id} → agent {agent_name}; "
        f"calls to other numbers or from other addresses are refused (busy) by the agent")


def can_serve_web() -> bool:
    if shutil.which("npm") is not None:
        return True
    say("npm is not installed: no web page (install Node.js 20+ for it); the rest starts anyway")
    return False


def wait_until_a_part_exits(stack: Stack) -> str:
    while True:
        for name, process in stack.processes.items():
            if not process.running():
                return name
        time.sleep(0.5)


def main() -> int:
    args = parse_args()
    # Ctrl-C raises KeyboardInterrupt; make SIGTERM (docker stop, systemd) do the same.
    signal.signal(signal.SIGTERM, signal.default_int_handler)

    ensure_livekit_server()
    if args.sip:
        ensure_livekit_sip()
    serve_web = not args.no_web and can_serve_web()

    livekit_url = f"ws://127.0.0.1:{args.livekit_port}"
    omni_url = f"ws://127.0.0.1:{args.worker_port}/v1/realtime"
    omni_api_key = os.environ.get("OMNI_API_KEY") or None

    stack = Stack(say=say)
    try:
        if args.sip:
            stack.start(redis_server(args.redis_port))
        stack.start(livekit_server(args.livekit_port, args.livekit_port + 1, args.livekit_port + 2,
                                   redis_port=args.redis_port if args.sip else None))
        if args.sip:
            stack.start(livekit_sip(livekit_url=livekit_url, redis_port=args.redis_port, sip_port=args.sip_port,
                                    rtp_ports=(10000, 10099)))
        say(f"loading the omni worker ({args.engine}, {args.model}); a real model takes minutes")
        # tiny-random speaks 2-5 s of random sound a reply: the reference engine's own defaults for it
        stack.start(omni_worker(args.worker_port, model=args.model, engine=args.engine, api_key=omni_api_key))
        # INFO: the turn lines without livekit-agents' debug chatter (LIVEKIT_LOG_LEVEL=DEBUG for it)
        agent_env = {"LIVEKIT_LOG_LEVEL": os.environ.get("LIVEKIT_LOG_LEVEL", "INFO")}
        if args.sip:
            # named, as the rule dispatches it; the web page's tokens then ask for it by name too
            agent_env["AGENT_NAME"] = os.environ["AGENT_NAME"] = PHONE_AGENT_NAME
        stack.start(voice_agent(livekit_url=livekit_url, omni_url=omni_url, omni_api_key=omni_api_key,
                                env=agent_env))
        if serve_web:
            stack.start(web_page(args.web_port, livekit_url=livekit_url))
        if args.sip:
            provision_phone_line(livekit_url, PHONE_AGENT_NAME)

        print(flush=True)
        if serve_web:
            say(f"ready: open http://127.0.0.1:{args.web_port}/ and allow the microphone")
        else:
            joins = (f"a token that dispatches `{PHONE_AGENT_NAME}` brings the agent" if args.sip
                     else "join any room and the agent comes")
            say(f"ready: LiveKit at {livekit_url} (keys devkey / secret); {joins}")
        if args.model == "tiny-random":
            say("the model is tiny-random: replies are random sounds (set OMNI_MODEL for a real model)")
        if args.sip:
            say(f"phone line: dial sip:+15105550100@127.0.0.1:{args.sip_port} (docs/sip.md)")
        say("Ctrl-C stops everything")
        print(flush=True)

        exited = wait_until_a_part_exits(stack)
        say(f"{exited} exited unexpectedly ({stack.processes[exited].last_words()}); stopping the rest")
        return 1
    except StackError as e:
        say(f"error: {e}")
        return 1
    except KeyboardInterrupt:
        print(flush=True)
        say("stopping ...")
        return 0
    finally:
        # A second Ctrl-C must not leave children running half-stopped.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        stack.stop()


if __name__ == "__main__":
    sys.exit(main())
