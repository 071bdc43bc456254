"""End to end, as a person would use it: the browser client in headless Chromium talks to the
agent through a real LiveKit server.

    LiveKit server (--dev) + omni worker (tiny-random) + agent worker + web/server.py
    Chromium opens the page, presses Connect; its fake microphone plays a spoken WAV file.

The agent's greeting is switched off, so any agent audio the page hears is an answer to the
speech from the microphone. The page exposes what it saw in `window.omniAgent` (see
web/src/main.js): connection status, WebRTC inbound audio counters, transcript lines.

Needs: Debian `chromium`, the LiveKit server binary (scripts/install-livekit-server.sh), and
the built page (`npm ci && npm run build` in web/). Each missing piece skips with its reason.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from web.headless import BrowserError, HeadlessChromium, find_chromium

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[2]
SPEECH_WAV = REPO / "tests" / "data" / "hello_agent_16k.wav"
LIVEKIT_KEY, LIVEKIT_SECRET = "devkey", "secret"  # what `livekit-server --dev` accepts
# Ports of this test (the browser tests own 18400-18499); WebRTC media goes over one UDP port.
LIVEKIT_PORT, LIVEKIT_RTC_TCP_PORT, LIVEKIT_RTC_UDP_PORT = 18440, 18441, 18442
WEB_PORT = 18443
START_TIMEOUT_S = 120
# Generous bounds for 2 loaded CPU cores: the agent's job process loads VAD and turn-detector
# models, and the reference engine runs on the CPU. These are limits, not measurements.
AGENT_JOIN_TIMEOUT_S = 120
AGENT_ANSWER_TIMEOUT_S = 180
# Enough decoded agent audio to be a reply, not a stray packet: 0.5 s at WebRTC's 48 kHz...
MIN_AGENT_SAMPLES = 24_000
# ...and louder than silence: WebRTC's totalAudioEnergy sums level² × seconds, so comfort
# noise stays far below this while any audible sound passes it quickly.
MIN_AGENT_AUDIO_ENERGY = 1e-5


class BackgroundProcess:
    """A subprocess with its output in a log file, stopped with SIGTERM at the end."""

    def __init__(self, name: str, cmd: list[str], log_dir: Path, env: dict[str, str] | None = None) -> None:
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                cmd, cwd=REPO, env={**os.environ, **(env or {}), "PYTHONUNBUFFERED": "1"},
                stdout=log, stderr=subprocess.STDOUT,
            )

    def log_tail(self, lines: int = 30) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return f"--- {self.name} log ({self.log_path}) ---\n" + "\n".join(text.splitlines()[-lines:])

    def wait_until(self, ready, what: str, timeout: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}\n{self.log_tail()}")
            if ready():
                return
            time.sleep(0.2)
        raise TimeoutError(f"{self.name}: {what} not seen within {timeout:.0f} s\n{self.log_tail()}")

    def wait_for_log(self, text: str, timeout: float = START_TIMEOUT_S) -> None:
        self.wait_until(lambda: text in self.log_path.read_text(errors="replace"), repr(text), timeout)

    def wait_for_http(self, url: str, timeout: float = START_TIMEOUT_S) -> None:
        def answers() -> bool:
            try:
                with urllib.request.urlopen(url, timeout=2) as response:
                    return response.status == 200
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                return False

        self.wait_until(answers, f"200 from {url}", timeout)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def livekit_server_binary() -> str | None:
    candidates = [os.environ.get("LIVEKIT_SERVER_BIN"), str(REPO / ".tools/bin/livekit-server"),
                  shutil.which("livekit-server")]
    return next((c for c in candidates if c and os.access(c, os.X_OK)), None)


@pytest.fixture
def browser_livekit_server(tmp_path):
    binary = livekit_server_binary()
    if binary is None:
        pytest.skip("no LiveKit server binary: run scripts/install-livekit-server.sh")
    server = BackgroundProcess(
        "livekit-server",
        [str(REPO / "scripts/livekit-server.sh"), "--port", str(LIVEKIT_PORT),
         "--rtc-tcp-port", str(LIVEKIT_RTC_TCP_PORT), "--rtc-udp-port", str(LIVEKIT_RTC_UDP_PORT)],
        tmp_path, env={"LIVEKIT_SERVER_BIN": binary},
    )
    try:
        server.wait_for_http(f"http://127.0.0.1:{LIVEKIT_PORT}/")
        yield server
    finally:
        server.stop()


@pytest.fixture
def browser_agent(tmp_path, omni_worker, browser_livekit_server):
    agent = BackgroundProcess(
        "agent",
        [sys.executable, str(REPO / "agent/agent.py"), "dev"],
        tmp_path,
        env={
            "LIVEKIT_URL": f"ws://127.0.0.1:{LIVEKIT_PORT}",
            "LIVEKIT_API_KEY": LIVEKIT_KEY,
            "LIVEKIT_API_SECRET": LIVEKIT_SECRET,
            "OMNI_URL": omni_worker.url,
            "OMNI_API_KEY": omni_worker.api_key,
            "AGENT_GREETING": "",  # wait for the user: agent audio then answers our speech
            "AGENT_NAME": "",  # automatic dispatch to every new room, as the page relies on
        },
    )
    try:
        agent.wait_for_log("registered worker")
        yield agent
    finally:
        agent.stop()


@pytest.fixture
def web_page(tmp_path, browser_livekit_server):
    if not (REPO / "web/dist/app.js").is_file():
        pytest.skip("the page is not built: run `npm ci && npm run build` in web/")
    server = BackgroundProcess(
        "web-server",
        [sys.executable, str(REPO / "web/server.py"), "--port", str(WEB_PORT)],
        tmp_path,
        env={"LIVEKIT_URL": f"ws://127.0.0.1:{LIVEKIT_PORT}",
             "LIVEKIT_API_KEY": LIVEKIT_KEY, "LIVEKIT_API_SECRET": LIVEKIT_SECRET},
    )
    try:
        server.wait_for_http(f"http://127.0.0.1:{WEB_PORT}/health")
        yield f"http://127.0.0.1:{WEB_PORT}/"
    finally:
        server.stop()


@pytest.fixture
async def browser(tmp_path):
    if find_chromium() is None:
        pytest.skip("no Chromium: apt-get install chromium")
    async with HeadlessChromium(fake_microphone_wav=SPEECH_WAV, log_path=tmp_path / "chromium.log") as chromium:
        yield chromium


class PageWatcher:
    """Waits on the page's state and, when a wait fails, says everything useful at once."""

    def __init__(self, browser: HeadlessChromium, processes: list[BackgroundProcess], screenshot: Path) -> None:
        self.browser = browser
        self.processes = processes
        self.screenshot = screenshot

    async def state(self) -> dict:
        return await self.browser.evaluate("window.omniAgent")

    async def wait_for(self, condition: str, timeout: float, what: str) -> None:
        try:
            await self.browser.wait_for(condition, timeout=timeout)
        except BrowserError:
            pytest.fail(await self.report(f"the page never showed: {what}"), pytrace=False)

    async def report(self, headline: str) -> str:
        await self.browser.screenshot(self.screenshot)
        state = json.dumps(await self.state(), indent=1)
        console = "\n".join(self.browser.console[-20:])
        logs = "\n".join(process.log_tail() for process in self.processes)
        return f"{headline}\npage state: {state}\nscreenshot: {self.screenshot}\n--- page console ---\n{console}\n{logs}"


async def test_browser_user_talks_and_hears_the_agent(browser, web_page, browser_agent, browser_livekit_server, tmp_path):
    page = PageWatcher(browser, [browser_agent, browser_livekit_server], tmp_path / "page.png")
    await browser.open(f"{web_page}?room=browser-e2e")
    assert await browser.evaluate("document.body.dataset.state") == "idle"

    # A real click, as a user gesture, so the browser lets the page play audio.
    await browser.evaluate("document.getElementById('connect').click()", user_gesture=True)
    await page.wait_for("window.omniAgent.status === 'connected'", 30, "connected to the room")
    await page.wait_for("window.omniAgent.agentIdentity !== null", AGENT_JOIN_TIMEOUT_S, "the agent joined")

    # The fake microphone speaks; the agent must answer out loud, and the page must decode it.
    await page.wait_for(
        f"window.omniAgent.remoteAudio.totalSamplesReceived >= {MIN_AGENT_SAMPLES}"
        f" && window.omniAgent.remoteAudio.totalAudioEnergy >= {MIN_AGENT_AUDIO_ENERGY}",
        AGENT_ANSWER_TIMEOUT_S,
        "the agent's spoken answer arriving",
    )
    # The agent's words arrive as a live transcript (lk.transcription text stream).
    await page.wait_for(
        "window.omniAgent.transcript.some(line => line.speaker === 'agent' && line.text.trim() !== '')",
        60,
        "the agent's transcript",
    )
    await browser.screenshot(tmp_path / "talking.png")

    state = await page.state()
    assert state["error"] is None, await page.report("the page shows an error")
    assert state["room"] == "browser-e2e"
    rendered = await browser.evaluate("document.querySelector('#transcript li.agent')?.textContent ?? ''")
    agent_lines = [line["text"] for line in state["transcript"] if line["speaker"] == "agent"]
    assert agent_lines[0].strip() in rendered, "the transcript is in the state but not on the screen"

    await browser.evaluate("document.getElementById('disconnect').click()", user_gesture=True)
    await page.wait_for("window.omniAgent.status === 'disconnected'", 30, "disconnected")
    assert await browser.evaluate("document.getElementById('connect').disabled") is False


async def test_browser_shows_a_clear_error_when_livekit_is_down(browser, tmp_path):
    if not (REPO / "web/dist/app.js").is_file():
        pytest.skip("the page is not built: run `npm ci && npm run build` in web/")
    # A token server pointing at a port where no LiveKit server listens.
    server = BackgroundProcess(
        "web-server",
        [sys.executable, str(REPO / "web/server.py"), "--port", str(WEB_PORT + 1)],
        tmp_path,
        env={"LIVEKIT_URL": f"ws://127.0.0.1:{WEB_PORT + 2}"},
    )
    try:
        server.wait_for_http(f"http://127.0.0.1:{WEB_PORT + 1}/health")
        page = PageWatcher(browser, [server], tmp_path / "page.png")
        await browser.open(f"http://127.0.0.1:{WEB_PORT + 1}/")
        await browser.evaluate("document.getElementById('connect').click()", user_gesture=True)
        await page.wait_for("window.omniAgent.status === 'error'", 60, "an error")
        shown = await browser.evaluate("document.getElementById('error').textContent")
    finally:
        server.stop()
    assert f"Could not connect to the LiveKit server at ws://127.0.0.1:{WEB_PORT + 2}" in shown
    assert await browser.evaluate("document.getElementById('error').hidden") is False
    assert await browser.evaluate("document.getElementById('connect').disabled") is False
