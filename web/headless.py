"""Drive headless Chromium over the DevTools protocol (CDP), with nothing but aiohttp.

Used by the browser e2e test (tests/e2e/test_browser.py). Chromium comes from Debian (`apt-get install chromium`); Playwright's own browser download
cannot run on machines without internet, and a dozen CDP calls is all we need:

    async with HeadlessChromium(fake_microphone_wav=Path("speech.wav")) as browser:
        await browser.open("http://127.0.0.1:8080/")
        await browser.evaluate("document.getElementById('connect').click()", user_gesture=True)
        state = await browser.wait_for("window.omniAgent.status === 'connected' && window.omniAgent")
"""

from __future__ import annotations

import asyncio
import base64
import itertools
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

import aiohttp

# Flags for a quiet, self-contained browser: no first-run UI, no calls home, no GPU, and
# fake media devices that grant the microphone without asking and play a WAV file into it.
BASE_FLAGS = [
    "--headless",
    "--no-sandbox",  # we run as root in containers, where the sandbox cannot start
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--use-fake-ui-for-media-stream",
    "--use-fake-device-for-media-stream",
]


class BrowserError(RuntimeError):
    """The browser failed, or the page threw while evaluating an expression."""


def find_chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        if path := shutil.which(name):
            return path
    return None


class HeadlessChromium:
    """One headless Chromium process with one page, controlled over CDP."""

    def __init__(
        self,
        *,
        executable: str | None = None,
        fake_microphone_wav: Path | None = None,
        log_path: Path | None = None,
        window_size: tuple[int, int] = (900, 900),
    ) -> None:
        self.executable = executable or find_chromium()
        if self.executable is None:
            raise BrowserError("no Chromium found: install it with `apt-get install chromium`")
        self.fake_microphone_wav = fake_microphone_wav
        self.log_path = log_path
        self.window_size = window_size
        self.console: list[str] = []  # console messages and uncaught exceptions of the page
        self._ids = itertools.count(1)
        self._pending: dict[int, asyncio.Future] = {}
        self._profile: tempfile.TemporaryDirectory | None = None
        self._process: asyncio.subprocess.Process | None = None
        self._http: aiohttp.ClientSession | None = None
        self._socket: aiohttp.ClientWebSocketResponse | None = None
        self._reader: asyncio.Task | None = None

    async def __aenter__(self) -> HeadlessChromium:
        try:
            await self._launch()
        except BaseException:
            await self.close()
            raise
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def _launch(self) -> None:
        self._profile = tempfile.TemporaryDirectory(prefix="chromium-profile-", ignore_cleanup_errors=True)
        profile = Path(self._profile.name)
        flags = [
            *BASE_FLAGS,
            f"--user-data-dir={profile}",
            "--remote-debugging-address=127.0.0.1",
            "--remote-debugging-port=0",  # Chromium picks a free port and writes it to the profile
            f"--window-size={self.window_size[0]},{self.window_size[1]}",
        ]
        if self.fake_microphone_wav is not None:
            if not self.fake_microphone_wav.is_file():
                raise BrowserError(f"fake microphone file not found: {self.fake_microphone_wav}")
            flags.append(f"--use-file-for-fake-audio-capture={self.fake_microphone_wav.resolve()}")
        log = open(self.log_path or "/dev/null", "wb")
        try:
            self._process = await asyncio.create_subprocess_exec(
                self.executable, *flags, "about:blank", stdout=log, stderr=log
            )
        finally:
            log.close()

        port = await self._devtools_port(profile / "DevToolsActivePort")
        self._http = aiohttp.ClientSession()
        async with self._http.get(f"http://127.0.0.1:{port}/json/list") as response:
            targets = await response.json()
        page = next((t for t in targets if t["type"] == "page"), None)
        if page is None:
            raise BrowserError(f"Chromium has no page to control: {targets}")
        self._socket = await self._http.ws_connect(page["webSocketDebuggerUrl"], max_msg_size=0)
        self._reader = asyncio.create_task(self._read_messages())
        await self.send("Runtime.enable")
        await self.send("Page.enable")

    async def _devtools_port(self, port_file: Path, timeout: float = 30.0) -> int:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while loop.time() < deadline:
            if self._process.returncode is not None:
                raise BrowserError(f"Chromium exited at start (code {self._process.returncode}); see {self.log_path}")
            if port_file.is_file() and (text := port_file.read_text().strip()):
                return int(text.splitlines()[0])
            await asyncio.sleep(0.1)
        raise BrowserError(f"Chromium did not open its DevTools port within {timeout:.0f} s")

    async def _read_messages(self) -> None:
        async for message in self._socket:
            if message.type != aiohttp.WSMsgType.TEXT:
                break
            data = json.loads(message.data)
            if "id" in data:
                future = self._pending.pop(data["id"], None)
                if future is not None and not future.done():
                    future.set_result(data)
            elif data.get("method") == "Runtime.consoleAPICalled":
                params = data["params"]
                text = " ".join(str(arg.get("value", arg.get("description", ""))) for arg in params["args"])
                self.console.append(f"console.{params['type']}: {text}")
            elif data.get("method") == "Runtime.exceptionThrown":
                details = data["params"]["exceptionDetails"]
                self.console.append(f"exception: {details.get('exception', {}).get('description', details['text'])}")
        for future in self._pending.values():
            if not future.done():
                future.set_exception(BrowserError("the DevTools connection closed"))

    async def send(self, method: str, **params: Any) -> dict:
        """Sends one CDP command and returns its result."""
        message_id = next(self._ids)
        future = asyncio.get_running_loop().create_future()
        self._pending[message_id] = future
        await self._socket.send_json({"id": message_id, "method": method, "params": params})
        reply = await future
        if "error" in reply:
            raise BrowserError(f"{method} failed: {reply['error']}")
        return reply["result"]

    async def open(self, url: str) -> None:
        """Navigates and waits for the page's scripts to have run."""
        result = await self.send("Page.navigate", url=url)
        if result.get("errorText"):
            raise BrowserError(f"could not open {url}: {result['errorText']}")
        await self.wait_for("document.readyState === 'complete'", timeout=30)

    async def evaluate(self, expression: str, *, user_gesture: bool = False) -> Any:
        """Evaluates a JS expression in the page (awaiting promises) and returns its value."""
        result = await self.send(
            "Runtime.evaluate",
            expression=expression,
            awaitPromise=True,
            returnByValue=True,
            userGesture=user_gesture,
        )
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            raise BrowserError(f"{expression!r} threw: {details.get('exception', {}).get('description', details['text'])}")
        return result["result"].get("value")

    async def wait_for(self, expression: str, *, timeout: float, interval: float = 0.25) -> Any:
        """Polls until `expression` is truthy and returns its value; BrowserError on timeout."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            value = await self.evaluate(expression)
            if value:
                return value
            if loop.time() >= deadline:
                raise BrowserError(f"still false after {timeout:.0f} s: {expression}")
            await asyncio.sleep(interval)

    async def screenshot(self, path: Path) -> None:
        result = await self.send("Page.captureScreenshot", format="png")
        path.write_bytes(base64.b64decode(result["data"]))

    async def close(self) -> None:
        if self._reader is not None:
            self._reader.cancel()
        if self._socket is not None:
            await self._socket.close()
        if self._http is not None:
            await self._http.close()
        if self._process is not None and self._process.returncode is None:
            self._process.terminate()
            try:
                await asyncio.wait_for(self._process.wait(), timeout=10)
            except asyncio.TimeoutError:
                self._process.kill()
                await self._process.wait()
        if self._profile is not None:
            self._profile.cleanup()
            self._profile = None
