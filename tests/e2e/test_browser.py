"""End to end, as a person would use it: the browser client in headless Chromium talks to the
agent through a real LiveKit server.

    local_stack (tests/e2e/conftest.py): LiveKit server + omni worker (tiny-random) + agent
    + scripts/web-serve (the page and its token endpoint)
    + Chromium, whose fake microphone plays a spoken question, then 10 s of silence, in a loop

The page exposes what it saw in `window.omniAgent` (see web/src/main.js): connection status,
WebRTC inbound audio counters, transcript lines, and the agent's own events
(agent/room_events.py: what its VAD hears, one `turn` per reply).

Needs Debian `chromium`, the LiveKit server binary and npm (scripts/setup installs all three).
"""

from __future__ import annotations

import json
import wave
from pathlib import Path

import pytest

from scripts.stack import Stack, web_page
from web.headless import BrowserError, HeadlessChromium, find_chromium

pytestmark = pytest.mark.e2e

QUESTION_WAV = Path(__file__).resolve().parents[1] / "data" / "e2e_q1_time.wav"  # scripts/make-test-speech.sh
# Chromium loops the microphone file. The silence lets the agent finish its answer before the
# question comes again (a new question would interrupt it), even when the CPU is slow.
SILENCE_AFTER_QUESTION_S = 10.0
WEB_PORT = 18443  # the browser tests own ports 18400-18499
NO_LIVEKIT_WEB_PORT, NO_LIVEKIT_PORT = 18444, 18445  # nothing listens on the latter
# Generous bounds for 2 loaded CPU cores: the agent's job process loads VAD and turn-detector
# models, and the reference engine runs on the CPU. These are limits, not measurements.
AGENT_JOIN_TIMEOUT_S = 120
AGENT_REPLY_TIMEOUT_S = 180
# Enough decoded agent audio to be speech, not a stray packet: 0.5 s at WebRTC's 48 kHz...
MIN_AGENT_SAMPLES = 24_000
# ...and louder than silence: WebRTC's totalAudioEnergy sums level² × seconds, so decoded
# silence stays at 0 and comfort noise far below this, while any audible sound passes it.
MIN_AGENT_AUDIO_ENERGY = 1e-5


@pytest.fixture(scope="module")
def web_page_url(local_stack, tmp_path_factory):
    """The page and token endpoint, pointed at the local stack's LiveKit server."""
    with Stack(echo=None, log_dir=tmp_path_factory.mktemp("web")) as stack:
        stack.start(web_page(WEB_PORT, livekit_url=local_stack.livekit_url))
        yield f"http://127.0.0.1:{WEB_PORT}/"


@pytest.fixture
def microphone_wav(tmp_path) -> Path:
    """The question with half a second of silence before it and SILENCE_AFTER_QUESTION_S after."""
    with wave.open(str(QUESTION_WAV)) as question:
        params, speech = question.getparams(), question.readframes(question.getnframes())
    frame_bytes = params.sampwidth * params.nchannels

    def silence(seconds: float) -> bytes:
        return bytes(int(seconds * params.framerate) * frame_bytes)

    path = tmp_path / "microphone.wav"
    with wave.open(str(path), "wb") as out:
        out.setparams(params)
        out.writeframes(silence(0.5) + speech + silence(SILENCE_AFTER_QUESTION_S))
    return path


@pytest.fixture
async def browser(tmp_path, microphone_wav):
    if find_chromium() is None:
        pytest.skip("no Chromium: apt-get install chromium")
    async with HeadlessChromium(fake_microphone_wav=microphone_wav, log_path=tmp_path / "chromium.log") as chromium:
        yield chromium


class PageWatcher:
    """Waits on the page's state; when a wait fails, says everything useful at once."""

    def __init__(self, browser: HeadlessChromium, screenshot: Path, logs: list[Path]) -> None:
        self.browser = browser
        self.screenshot = screenshot
        self.logs = logs

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
        logs = "\n".join(str(path) for path in self.logs)
        return (f"{headline}\npage state: {state}\nscreenshot: {self.screenshot}\n"
                f"--- page console ---\n{console}\n--- logs ---\n{logs}")


async def click(browser: HeadlessChromium, button_id: str) -> None:
    # A user gesture, as a real click is, so the browser lets the page play audio.
    await browser.evaluate(f"document.getElementById('{button_id}').click()", user_gesture=True)


def agent_lines(state: dict) -> list[dict]:
    return [line for line in state["transcript"] if line["speaker"] == "agent"]


async def test_browser_user_talks_with_the_agent_and_hears_it(browser, web_page_url, local_stack, tmp_path):
    page = PageWatcher(browser, tmp_path / "failure.png", sorted(local_stack.log_dir.glob("*.log")))
    await browser.open(web_page_url)  # the server picks the room, as for any visitor
    assert await browser.evaluate("document.body.dataset.state") == "idle"

    await click(browser, "connect")
    await page.wait_for("window.omniAgent.status === 'connected'", 30, "connected to the room")
    await page.wait_for("window.omniAgent.agentIdentity !== null", AGENT_JOIN_TIMEOUT_S, "the agent joined")

    # The agent hears the browser's microphone (its VAD reports the user speaking), and
    # answers: two replies, since the greeting comes once and the second answers our speech.
    await page.wait_for(
        "window.omniAgent.agentEvents.some(e => e.type === 'user_state' && e.state === 'speaking')",
        AGENT_REPLY_TIMEOUT_S,
        "the agent hearing the microphone",
    )
    await page.wait_for(
        "window.omniAgent.agentEvents.filter(e => e.type === 'turn').length >= 2",
        AGENT_REPLY_TIMEOUT_S,
        "the agent's answer to the microphone",
    )
    # The page heard the agent's voice, decoded it, and shows its words.
    await page.wait_for(
        f"window.omniAgent.remoteAudio.totalSamplesReceived >= {MIN_AGENT_SAMPLES}"
        f" && window.omniAgent.remoteAudio.totalAudioEnergy >= {MIN_AGENT_AUDIO_ENERGY}",
        30,
        "the agent's voice arriving",
    )
    await page.wait_for(
        "window.omniAgent.transcript.some(line => line.speaker === 'agent' && line.text.trim())",
        30,
        "the agent's words in the transcript",
    )
    # The user's words (transcribed by the worker) are in the conversation too, before the
    # agent's answer to them; each reply shows how long endpointing and the model took.
    await page.wait_for(
        "window.omniAgent.transcript.some(line => line.speaker === 'user' && line.final)",
        AGENT_REPLY_TIMEOUT_S,
        "the user's words in the transcript",
    )
    # and the agent's answer after them (its transcript comes as it speaks: wait for it)
    await page.wait_for(
        "(t => { const u = t.findIndex(line => line.speaker === 'user');"
        " return u >= 0 && t.slice(u).some(line => line.speaker === 'agent'); })"
        "(window.omniAgent.transcript)",
        AGENT_REPLY_TIMEOUT_S,
        "the agent's answer after the user's words",
    )
    # (a reply cut by the next question, as the looping microphone does, may end before the
    # worker reports its first-audio time: the page then shows "–" for the model)
    await page.wait_for(
        "window.omniAgent.replies.some(r => r.endpointingMs !== null)",
        AGENT_REPLY_TIMEOUT_S,
        "a reply with its endpointing time",
    )
    # The microphone's level is shown while it plays the fake speech, and mute works.
    await page.wait_for("window.omniAgent.microphone.level > 0", 30, "the microphone level")
    await click(browser, "mute")
    await page.wait_for("window.omniAgent.microphone.muted === true", 10, "muted")
    assert await browser.evaluate("document.getElementById('mic-state').textContent") == "muted"
    await click(browser, "mute")
    await page.wait_for("window.omniAgent.microphone.muted === false", 10, "unmuted")
    await browser.screenshot(tmp_path / "talking.png")

    state = await page.state()
    assert state["error"] is None, await page.report("the page shows an error")
    assert state["room"].startswith("omni-")
    assert await browser.evaluate("document.getElementById('room-name').textContent") == state["room"]
    rendered = await browser.evaluate(
        "[...document.querySelectorAll('#transcript li.agent')].map(li => li.textContent).join('\\n')"
    )
    for line in agent_lines(state):
        assert line["text"].strip() in rendered, "a transcript line is in the state but not on the screen"
    speakers = [line["speaker"] for line in state["transcript"]]
    # both sides, a turn of ours before the agent's answer to it
    assert "user" in speakers and "agent" in speakers[speakers.index("user"):], speakers
    rows = await browser.evaluate("document.querySelectorAll('#replies tbody tr').length")
    assert rows == len(state["replies"]) >= 2

    await click(browser, "disconnect")
    await page.wait_for("window.omniAgent.status === 'disconnected'", 30, "disconnected")
    assert await browser.evaluate("document.getElementById('connect').disabled") is False
    # the call's state went with it
    after = await page.state()
    assert (after["transcript"], after["replies"], after["agentEvents"]) == ([], [], [])
    assert await browser.evaluate("document.querySelectorAll('#transcript li').length") == 0


async def test_browser_shows_a_clear_error_when_livekit_is_unreachable(browser, tmp_path):
    no_livekit_url = f"ws://127.0.0.1:{NO_LIVEKIT_PORT}"
    with Stack(echo=None, log_dir=tmp_path) as stack:
        stack.start(web_page(NO_LIVEKIT_WEB_PORT, livekit_url=no_livekit_url))
        page = PageWatcher(browser, tmp_path / "failure.png", [tmp_path / "web.log"])
        await browser.open(f"http://127.0.0.1:{NO_LIVEKIT_WEB_PORT}/")
        await click(browser, "connect")
        await page.wait_for("window.omniAgent.status === 'error'", 60, "an error")
        shown = await browser.evaluate("document.getElementById('error').textContent")
    assert f"Could not connect to the LiveKit server at {no_livekit_url}" in shown
    assert await browser.evaluate("document.getElementById('error').hidden") is False
    assert await browser.evaluate("document.getElementById('connect').disabled") is False


async def test_browser_refuses_a_crafted_link_to_another_room(browser, tmp_path):
    """A link with ?room= and ?identity= of someone else's choosing does not put the visitor in
    that room (nor under that name): the token endpoint refuses it and the page says why.
    Refused before any LiveKit connection, so no LiveKit is needed."""
    with Stack(echo=None, log_dir=tmp_path) as stack:
        stack.start(web_page(NO_LIVEKIT_WEB_PORT, livekit_url=f"ws://127.0.0.1:{NO_LIVEKIT_PORT}"))
        page = PageWatcher(browser, tmp_path / "failure.png", [tmp_path / "web.log"])
        await browser.open(f"http://127.0.0.1:{NO_LIVEKIT_WEB_PORT}/?room=attacker-room&identity=victim")
        await click(browser, "connect")
        await page.wait_for("window.omniAgent.status === 'error'", 60, "an error")
        shown = await browser.evaluate("document.getElementById('error').textContent")
        state = await page.state()
    assert "The token endpoint refused: this server picks the" in shown
    assert state["room"] is None and state["identity"] is None
