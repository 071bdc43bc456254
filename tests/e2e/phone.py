"""A SIP phone for the phone tests and the phone benchmark: baresip (Debian's baresip-core),
headless, on loopback.

What it says comes from a WAV file (baresip's `aufile` audio source); what it hears and what
it sent are written to WAV files by baresip's `sndfile` filter, as decoded (the G.711 audio
at 8 kHz). baresip hangs up when the source file ends, so the file's length is the call's.
Keypad presses and a hang-up at a chosen moment go in through the `cons` module (keys over
UDP, as typed at baresip's console). Every output line of baresip is kept with the wall-clock
time it arrived, which places the two recordings on the clock:

- the sent recording starts when the audio source starts (`audio: source started`);
- the received one starts with the first RTP packet (`incoming rtp for 'audio' established`);
  LiveKit's SIP service then sends a packet every 20 ms, silence included, so both run in
  real time to the hang-up (checked: `Recording.aligned_within`).

`room_of` finds the room LiveKit SIP made for a phone's call (to watch the agent's events there).
"""

from __future__ import annotations

import asyncio
import re
import shutil
import socket
import subprocess
import threading
import time
import wave
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import soxr
from livekit import api

RATE = 8000  # G.711
# A 20 ms stretch of the received audio louder than this (RMS of int16 samples) is the agent's
# voice; LiveKit SIP's silence is ~3, tiny-random's speech ~100 at the phone.
VOICE_RMS = 30.0
WINDOW_S = 0.02


def baresip_available() -> bool:
    return shutil.which("baresip") is not None and Path("/usr/lib/baresip/modules/aufile.so").is_file()


def to_phone_rate(samples_16k: np.ndarray) -> np.ndarray:
    return soxr.resample(samples_16k.astype(np.float32), 16000, RATE).clip(-32768, 32767).astype(np.int16)


def silence(seconds: float) -> np.ndarray:
    return np.zeros(int(seconds * RATE), dtype=np.int16)


@dataclass
class Script:
    """What the phone says, in order: 8 kHz samples, and where each named part starts and ends
    (seconds from the start of the call's audio)."""

    parts: list[np.ndarray] = field(default_factory=list)
    marks: dict[str, tuple[float, float]] = field(default_factory=dict)

    def pause(self, seconds: float) -> Script:
        self.parts.append(silence(seconds))
        return self

    def say(self, name: str, samples_16k: np.ndarray) -> Script:
        start = self.duration
        self.parts.append(to_phone_rate(samples_16k))
        self.marks[name] = (start, self.duration)
        return self

    @property
    def duration(self) -> float:
        return sum(len(p) for p in self.parts) / RATE

    def samples(self) -> np.ndarray:
        return np.concatenate(self.parts) if self.parts else silence(0.1)


def read_wav(path: Path) -> np.ndarray:
    with wave.open(str(path)) as w:
        if (w.getframerate(), w.getnchannels(), w.getsampwidth()) != (RATE, 1, 2):
            raise ValueError(f"{path}: expected 8 kHz mono 16-bit PCM")
        return np.frombuffer(w.readframes(w.getnframes()), dtype=np.int16)


@dataclass
class Recording:
    sent: np.ndarray
    heard: np.ndarray
    sent_started_at: float  # wall clock of the first sent sample
    heard_started_at: float  # wall clock of the first received sample

    @property
    def offset_s(self) -> float:
        """Where the received recording starts on the sent recording's time line."""
        return self.heard_started_at - self.sent_started_at

    def aligned_within(self) -> float:
        """How far the two recordings' ends disagree (both run to the hang-up): a gap in the
        received audio would show here."""
        return abs(len(self.sent) / RATE - (self.offset_s + len(self.heard) / RATE))

    def voiced(self, samples: np.ndarray) -> np.ndarray:
        """Per 20 ms window: louder than VOICE_RMS."""
        n = int(WINDOW_S * RATE)
        windows = samples[: len(samples) // n * n].astype(np.float32).reshape(-1, n)
        return np.sqrt((windows**2).mean(axis=1)) > VOICE_RMS

    def voiced_at(self) -> list[float]:
        """The wall-clock start of every voiced 20 ms window of what the phone heard."""
        return [self.heard_started_at + i * WINDOW_S for i in np.flatnonzero(self.voiced(self.heard))]

    def heard_rms(self, start_s: float, end_s: float) -> float:
        """RMS of what the phone heard between two times of the sent time line."""
        a = max(0, int((start_s - self.offset_s) * RATE))
        b = max(a, int((end_s - self.offset_s) * RATE))
        part = self.heard[a:b].astype(np.float32)
        return float(np.sqrt((part**2).mean())) if part.size else 0.0

    def first_voice_after(self, t: float) -> float | None:
        """The first voiced 20 ms of what the phone heard after `t` (sent time line)."""
        voiced = self.voiced(self.heard)
        for i in np.flatnonzero(voiced):
            at = self.offset_s + i * WINDOW_S
            if at >= t:
                return float(at)
        return None

    def voice_stops_after(self, t: float, *, quiet_s: float = 0.3) -> float:
        """When the agent's voice that is playing at `t` stops (the start of the first quiet
        stretch of `quiet_s` after `t`); `t` itself if it is quiet then."""
        voiced = self.voiced(self.heard)
        i = max(0, int((t - self.offset_s) / WINDOW_S))
        need = int(quiet_s / WINDOW_S)
        run = 0
        while i < len(voiced):
            run = 0 if voiced[i] else run + 1
            if run >= need:
                return self.offset_s + (i - need + 1) * WINDOW_S
            i += 1
        return self.offset_s + len(voiced) * WINDOW_S

    def last_voice_between(self, start: float, end: float) -> float | None:
        voiced = self.voiced(self.heard)
        times = [self.offset_s + i * WINDOW_S for i in np.flatnonzero(voiced)]
        inside = [t for t in times if start <= t < end]
        return inside[-1] if inside else None

    def voiced_seconds_between(self, start: float, end: float) -> float:
        voiced = self.voiced(self.heard)
        times = [self.offset_s + i * WINDOW_S for i in np.flatnonzero(voiced)]
        return sum(WINDOW_S for t in times if start <= t < end)


class Phone:
    """One baresip instance with one account (`number`), in its own folder."""

    def __init__(self, workdir: Path, *, number: str, sip_port: int, rtp_ports: tuple[int, int],
                 console_port: int, codec: str = "PCMU", answer: bool = False) -> None:
        """`answer`: pick up incoming calls by itself (a transfer target)."""
        self.dir = workdir
        self.number = number
        self.sip_port = sip_port
        self.console_port = console_port
        self.codec = codec
        self.dir.mkdir(parents=True, exist_ok=True)
        self.recordings = self.dir / "recordings"
        self.recordings.mkdir(exist_ok=True)
        self.source = self.dir / "says.wav"
        self.lines: list[tuple[float, str]] = []
        self._lock = threading.Lock()
        self.proc: subprocess.Popen[str] | None = None
        self._write_config(rtp_ports, answer)

    def _write_config(self, rtp_ports: tuple[int, int], answer: bool) -> None:
        # Each setting spelled out: with a config file, what it leaves out is zero, not the default.
        # jitter_buffer_delay: 2-4 frames (40-80 ms) of RTP held before decoding, as a desk
        # phone on a LAN holds; baresip's template has 5-10 (100-200 ms).
        (self.dir / "config").write_text(f"""\
poll_method		epoll
sip_listen		127.0.0.1:{self.sip_port}
call_local_timeout	120
call_max_calls		4
audio_source		aufile,{self.source}
audio_level		no
ausrc_format		s16
auplay_format		s16
auenc_format		s16
audec_format		s16
audio_buffer		20-160
rtp_ports		{rtp_ports[0]}-{rtp_ports[1]}
rtcp_mux		no
jitter_buffer_delay	2-4
module_path		/usr/lib/baresip/modules
module			cons.so
module			aufile.so
module			g711.so
module			sndfile.so
module_tmp		account.so
module_app		menu.so
cons_listen		127.0.0.1:{self.console_port}
snd_path		{self.recordings}
""")
        mode = ";answermode=auto" if answer else ""
        (self.dir / "accounts").write_text(
            f"<sip:{self.number}@127.0.0.1:{self.sip_port}>;regint=0;audio_codecs={self.codec}{mode}\n")

    def start(self, script: Script | None = None, *, dial: str | None = None) -> None:
        """Start baresip; `dial`: the SIP URI to call at once."""
        samples = (script or Script().pause(60)).samples()
        with wave.open(str(self.source), "wb") as w:
            w.setnchannels(1)
            w.setsampwidth(2)
            w.setframerate(RATE)
            w.writeframes(samples.tobytes())
        argv = ["stdbuf", "-oL", "-eL", "baresip", "-n", "127.0.0.1", "-f", str(self.dir)]
        if dial:
            argv += ["-e", f"/dial {dial}"]
        self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True, errors="replace", bufsize=1)
        threading.Thread(target=self._read, daemon=True, name=f"baresip-{self.number}").start()

    def _read(self) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        buffer = ""
        log = open(self.dir / "baresip.log", "w")  # noqa: SIM115
        while chunk := self.proc.stdout.read(1):
            if chunk not in "\r\n":
                buffer += chunk
                continue
            line, buffer = buffer.strip(), ""
            if not line or line.startswith("[0:"):  # the call's running timer
                continue
            now = time.time()
            with self._lock:
                self.lines.append((now, line))
            log.write(f"{now:.3f} {line}\n")
            log.flush()
        log.close()

    def find(self, pattern: str) -> tuple[float, str] | None:
        regex = re.compile(pattern)
        with self._lock:
            return next(((t, line) for t, line in self.lines if regex.search(line)), None)

    def wait_for(self, pattern: str, timeout: float) -> tuple[float, str]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if found := self.find(pattern):
                return found
            if self.proc is not None and self.proc.poll() is not None:
                break
            time.sleep(0.02)
        raise TimeoutError(f"phone {self.number}: no line matching {pattern!r} within {timeout:.0f} s; "
                           f"it said: {self.transcript()}")

    def transcript(self) -> str:
        with self._lock:
            return " | ".join(line for _, line in self.lines[-25:])

    def press(self, keys: str) -> None:
        """Type at baresip's console: digits in a call are sent as DTMF."""
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            for key in keys:
                s.sendto(key.encode(), ("127.0.0.1", self.console_port))
                time.sleep(0.15)

    def hang_up(self) -> None:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.sendto(b"/hangup\n", ("127.0.0.1", self.console_port))

    def wait_call_over(self, timeout: float) -> tuple[float, str]:
        return self.wait_for(r"terminated|session closed|Call failed|call: .* failed", timeout)

    def recording(self) -> Recording:
        """The call's two recordings, once it is over."""
        sent_files = sorted(self.recordings.glob("dump-*-enc.wav"))
        heard_files = sorted(self.recordings.glob("dump-*-dec.wav"))
        if not sent_files or not heard_files:
            raise AssertionError(f"phone {self.number} recorded nothing: {self.transcript()}")
        sent_at, _ = self.wait_for(r"audio: source started", 1)
        heard_at, _ = self.wait_for(r"incoming rtp for 'audio' established", 1)
        return Recording(sent=read_wav(sent_files[-1]), heard=read_wav(heard_files[-1]),
                         sent_started_at=sent_at, heard_started_at=heard_at)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()  # baresip hangs up what is still going (a BYE, or a CANCEL)
        try:
            self.proc.wait(2)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


async def room_of(livekit_url: str, number: str, timeout: float = 20.0) -> str:
    """The room LiveKit SIP made for the call from `number` (the rule's `call-` prefix, then
    the number)."""
    deadline = time.monotonic() + timeout
    async with api.LiveKitAPI(livekit_url.replace("ws://", "http://"), "devkey", "secret") as lk:
        while time.monotonic() < deadline:
            rooms = await lk.room.list_rooms(api.ListRoomsRequest())
            for room in rooms.rooms:
                if room.name.startswith("call-") and number in room.name:
                    return room.name
            await asyncio.sleep(0.1)
    raise TimeoutError(f"no room for the call from {number} within {timeout:.0f} s")
