"""The local stack's processes: how to start each one, how to tell it is ready, how to stop it.

Used by `scripts/dev` (the one-command local stack), the end-to-end tests and the
voice-to-voice benchmark, so all three run the parts exactly the same way.

Each part runs in its own process group; its output lines are printed with the part's name in
front (and kept in a log file when asked). `Stack.stop()` stops the parts in reverse order:
SIGINT first (what Ctrl-C would send), then SIGTERM, then SIGKILL for a part that hangs.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TextIO

REPO = Path(__file__).resolve().parents[1]
LIVEKIT_SERVER_BIN = REPO / ".tools" / "bin" / "livekit-server"
LIVEKIT_SIP_BIN = REPO / ".tools" / "bin" / "livekit-sip"
DEV_API_KEY, DEV_API_SECRET = "devkey", "secret"  # what `livekit-server --dev` accepts


class StackError(RuntimeError):
    pass


@dataclass
class Service:
    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    ready_url: str | None = None  # ready when a GET answers 200
    ready_log: str | None = None  # ready when an output line matches this regex
    ready_timeout_s: float = 120.0
    stop_timeout_s: float = 15.0
    # Must be free before it starts: otherwise whatever already listens there could answer
    # the readiness check.
    tcp_ports: tuple[int, ...] = ()


def port_in_use(port: int) -> bool:
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


class Process:
    """One running service: its output pump, readiness and shutdown."""

    def __init__(self, service: Service, *, echo: TextIO | None, log_dir: Path | None, width: int) -> None:
        self.service = service
        self._echo = echo
        self._prefix = f"{service.name:>{width}} | "
        self._ready_pattern = re.compile(service.ready_log) if service.ready_log else None
        self._log_ready = threading.Event()
        self._tail: deque[str] = deque(maxlen=60)
        self._lines: list[str] = []
        self._lines_lock = threading.Lock()
        self.log_path = log_dir / f"{service.name}.log" if log_dir else None
        self._log_file = open(self.log_path, "w") if self.log_path else None  # noqa: SIM115
        self.proc = subprocess.Popen(
            service.argv,
            cwd=REPO,
            env={**os.environ, "PYTHONUNBUFFERED": "1", **service.env},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            start_new_session=True,  # its own process group: Ctrl-C reaches it only through us
        )
        self._pump = threading.Thread(target=self._read_output, name=f"{service.name}-output", daemon=True)
        self._pump.start()

    def _read_output(self) -> None:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            line = raw.rstrip("\n")
            self._tail.append(line)
            with self._lines_lock:
                self._lines.append(line)
            if self._log_file:
                self._log_file.write(line + "\n")
                self._log_file.flush()
            if self._echo:
                self._echo.write(self._prefix + line + "\n")
                self._echo.flush()
            if self._ready_pattern and self._ready_pattern.search(line):
                self._log_ready.set()

    def lines(self) -> list[str]:
        with self._lines_lock:
            return list(self._lines)

    def running(self) -> bool:
        return self.proc.poll() is None

    def last_words(self) -> str:
        """Its last line of output: where a service that gives up says why (LiveKit SIP's
        `unable to connect to redis: ...`, a Python traceback's exception)."""
        return next((line.strip() for line in reversed(self._tail) if line.strip()), "(no output)")

    def wait_ready(self) -> None:
        s = self.service
        deadline = time.monotonic() + s.ready_timeout_s
        while time.monotonic() < deadline:
            if not self.running():
                self._pump.join(timeout=2.0)  # its last lines, which say why
                raise StackError(f"{s.name} exited with code {self.proc.returncode} before it was ready: "
                                 f"{self.last_words()}\n" + "\n".join(self._tail))
            if self._is_ready():
                return
            time.sleep(0.25)
        raise StackError(f"{s.name} not ready after {s.ready_timeout_s:.0f} s; its last line: {self.last_words()}\n"
                         + "\n".join(self._tail))

    def _is_ready(self) -> bool:
        s = self.service
        if s.ready_url:
            try:
                with urllib.request.urlopen(s.ready_url, timeout=1.0) as r:
                    url_ok = r.status == 200
            except (urllib.error.URLError, OSError):
                url_ok = False
            if not url_ok:
                return False
        return self._log_ready.is_set() if self._ready_pattern else True

    def signal(self, sig: int, *, whole_group: bool = True) -> None:
        """To the process group we created for it, children included, as a terminal's Ctrl-C
        would; `whole_group=False`: to the main process only, as `docker stop` or Kubernetes."""
        try:
            if whole_group:
                os.killpg(self.proc.pid, sig)
            else:
                self.proc.send_signal(sig)
        except ProcessLookupError:
            pass

    def stop(self) -> int | None:
        for sig, wait_s in ((signal.SIGINT, self.service.stop_timeout_s), (signal.SIGTERM, 5.0),
                            (signal.SIGKILL, 5.0)):
            if not self.running():
                break
            self.signal(sig)
            try:
                self.proc.wait(wait_s)
            except subprocess.TimeoutExpired:
                continue
        # A job process the service left behind in its group goes with it.
        self.signal(signal.SIGKILL)
        self._pump.join(timeout=2.0)
        if self._log_file:
            self._log_file.close()
        return self.proc.returncode


class Stack:
    """Start services in order, each once the previous one is ready; stop them in reverse."""

    def __init__(self, *, echo: TextIO | None = sys.stdout, log_dir: Path | None = None,
                 say: Callable[[str], None] | None = None) -> None:
        self._echo = echo
        self._log_dir = log_dir
        self._say = say or (lambda msg: None)
        self.processes: dict[str, Process] = {}

    def start(self, service: Service, *, width: int = 8) -> Process:
        busy = [port for port in service.tcp_ports if port_in_use(port)]
        if busy:
            raise StackError(f"cannot start {service.name}: port {busy[0]} is already in use "
                             "(another copy of the stack running?)")
        self._say(f"starting {service.name} ...")
        started = time.monotonic()
        process = Process(service, echo=self._echo, log_dir=self._log_dir, width=width)
        self.processes[service.name] = process
        process.wait_ready()
        self._say(f"{service.name} ready ({time.monotonic() - started:.1f} s)")
        return process

    def stop(self) -> None:
        for name, process in reversed(list(self.processes.items())):
            if process.running():
                self._say(f"stopping {name} ...")
            code = process.stop()
            self._say(f"{name} stopped (exit code {code})")
        self.processes.clear()

    def __enter__(self) -> Stack:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --------------------------------------------------------------------------- the parts


def find_livekit_server() -> Path | None:
    """$LIVEKIT_SERVER_BIN, else .tools/bin/livekit-server (scripts/install-livekit-server.sh),
    else `livekit-server` on PATH."""
    if configured := os.environ.get("LIVEKIT_SERVER_BIN"):
        return Path(configured) if Path(configured).is_file() else None
    if LIVEKIT_SERVER_BIN.is_file():
        return LIVEKIT_SERVER_BIN
    on_path = shutil.which("livekit-server")
    return Path(on_path) if on_path else None


def livekit_server(port: int, rtc_tcp_port: int, rtc_udp_port: int, *, redis_port: int | None = None) -> Service:
    """`redis_port`: rooms in that Redis (redis_server), through which LiveKit's SIP service
    reaches the server (phone callers)."""
    binary = find_livekit_server()
    if binary is None:
        raise StackError("no LiveKit server binary: run scripts/install-livekit-server.sh")
    redis = ["--redis", f"127.0.0.1:{redis_port}"] if redis_port else []
    return Service(
        name="livekit",
        argv=[str(REPO / "scripts" / "livekit-server.sh"), "--port", str(port),
              "--rtc-tcp-port", str(rtc_tcp_port), "--rtc-udp-port", str(rtc_udp_port), *redis],
        env={"LIVEKIT_SERVER_BIN": str(binary)},
        tcp_ports=(port, rtc_tcp_port),
        ready_url=f"http://127.0.0.1:{port}/",
        ready_timeout_s=30.0,
    )


# tiny-random replies for tests and benchmarks: 12-13 s of (random) speech, long enough that a
# reply is still being generated when a barge-in ends the caller's turn (several seconds later)
# even on a fast machine; a short text part, so a reply ends with its audio.
TINY_RANDOM_REPLY = ("--engine-option", "min_audio_seconds=12", "--engine-option", "max_audio_seconds=13",
                     "--engine-option", "max_new_tokens=32")


def omni_worker(port: int, *, model: str = "tiny-random", engine: str = "reference",
                api_key: str | None = None, extra_args: tuple[str, ...] = ()) -> Service:
    argv = [sys.executable, "-m", "inference", "serve", "--engine", engine, "--model", model,
            "--host", "127.0.0.1", "--port", str(port), *extra_args]
    env = {}
    if api_key:
        env["OMNI_API_KEY"] = api_key
    else:
        argv.append("--insecure-no-auth")  # loopback only, for local use and tests
    return Service(name="worker", argv=argv, env=env, ready_url=f"http://127.0.0.1:{port}/health",
                   ready_timeout_s=600.0, tcp_ports=(port,))


def voice_agent(*, livekit_url: str, omni_url: str, omni_api_key: str | None = None, mode: str = "dev",
                env: dict[str, str] | None = None, connect_log: Path | None = None,
                checkout: Path = REPO) -> Service:
    """`connect_log`: run it under strace and log every connect() of the agent and its job
    processes there (the end-to-end tests check that nothing reaches outside this machine).
    `checkout`: the agent and plugin of another copy of the repository (benchmarks compare
    an older commit's agent with this one's)."""
    agent_env = {"LIVEKIT_URL": livekit_url, "LIVEKIT_API_KEY": DEV_API_KEY,
                 "LIVEKIT_API_SECRET": DEV_API_SECRET, "OMNI_URL": omni_url,
                 # this checkout's agent and plugin in the job processes too: they import the
                 # plugin before agent.py can put provider/ on the path, and would otherwise get
                 # whichever checkout the venv has installed
                 "PYTHONPATH": os.pathsep.join([str(checkout), str(checkout / "provider"),
                                                os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
                 **(env or {})}
    if omni_api_key:
        agent_env["OMNI_API_KEY"] = omni_api_key
    trace = []
    if connect_log:
        trace = ["strace", "-f", "-qq", "--seccomp-bpf", "-e", "trace=connect", "-o", str(connect_log)]
    return Service(
        name="agent",
        argv=[*trace, sys.executable, str(checkout / "agent" / "agent.py"), mode],
        env=agent_env,
        ready_log=r"registered worker",
        ready_timeout_s=120.0,
        stop_timeout_s=20.0,
    )


def web_page(port: int, *, livekit_url: str) -> Service:
    """`scripts/web-serve` builds the page with npm when its sources changed, then serves it."""
    return Service(
        name="web",
        argv=[str(REPO / "scripts" / "web-serve"), "--host", "127.0.0.1", "--port", str(port)],
        env={"LIVEKIT_URL": livekit_url, "LIVEKIT_API_KEY": DEV_API_KEY, "LIVEKIT_API_SECRET": DEV_API_SECRET,
             "PYTHON": sys.executable},
        ready_url=f"http://127.0.0.1:{port}/health",
        ready_timeout_s=300.0,  # a first `npm ci` downloads packages
        tcp_ports=(port,),
    )


# --------------------------------------------------------------------------- phone callers


def redis_server(port: int) -> Service:
    """Redis on loopback, in memory only: what the LiveKit server and its SIP service share
    (Debian's redis-server)."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise StackError("no redis-server on PATH: install Debian's redis-server (scripts/setup does, as root)")
    return Service(
        name="redis",
        argv=[binary, "--bind", "127.0.0.1", "--port", str(port), "--save", "", "--appendonly", "no",
              "--protected-mode", "yes"],
        ready_log=r"Ready to accept connections",
        ready_timeout_s=15.0,
        tcp_ports=(port,),
    )


def find_livekit_sip() -> Path | None:
    """$LIVEKIT_SIP_BIN, else .tools/bin/livekit-sip (scripts/install-livekit-sip.sh), else
    `livekit-sip` on PATH."""
    if configured := os.environ.get("LIVEKIT_SIP_BIN"):
        return Path(configured) if Path(configured).is_file() else None
    if LIVEKIT_SIP_BIN.is_file():
        return LIVEKIT_SIP_BIN
    on_path = shutil.which("livekit-sip")
    return Path(on_path) if on_path else None


def livekit_sip_config(*, livekit_url: str, redis_port: int, sip_port: int, rtp_ports: tuple[int, int],
                       api_key: str = DEV_API_KEY, api_secret: str = DEV_API_SECRET) -> str:
    """LiveKit SIP's YAML config for loopback: SIP (UDP and TCP) and RTP on 127.0.0.1 only,
    and 127.0.0.1 announced to callers in SIP and SDP (nat_1_to_1_ip; without it the service
    announces the first non-loopback interface's address)."""
    return (f"api_key: {api_key}\n"
            f"api_secret: {api_secret}\n"
            f"ws_url: {livekit_url}\n"
            f"redis:\n  address: 127.0.0.1:{redis_port}\n"
            f"sip_port: {sip_port}\n"
            f"listen_ip: 127.0.0.1\n"
            f"nat_1_to_1_ip: 127.0.0.1\n"
            f"rtp_port: {rtp_ports[0]}-{rtp_ports[1]}\n"
            "logging:\n  level: info\n")


def livekit_sip(*, livekit_url: str, redis_port: int, sip_port: int, rtp_ports: tuple[int, int]) -> Service:
    binary = find_livekit_sip()
    if binary is None:
        raise StackError("no LiveKit SIP binary: run scripts/install-livekit-sip.sh")
    return Service(
        name="sip",
        argv=[str(binary)],
        env={"SIP_CONFIG_BODY": livekit_sip_config(livekit_url=livekit_url, redis_port=redis_port,
                                                   sip_port=sip_port, rtp_ports=rtp_ports)},
        # it opens UDP, then TCP
        ready_log=r"sip signaling listening on.*tcp",
        ready_timeout_s=30.0,
        tcp_ports=(sip_port,),
    )
