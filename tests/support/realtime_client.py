"""A small Realtime protocol client for tests: raw JSON events over aiohttp."""

from __future__ import annotations

import asyncio
import base64
import json
from typing import Any

import aiohttp
import numpy as np


class RealtimeClient:
    def __init__(self, ws: aiohttp.ClientWebSocketResponse, http: aiohttp.ClientSession) -> None:
        self.ws = ws
        self._http = http
        self.events: list[dict[str, Any]] = []  # everything received, in order

    @classmethod
    async def connect(cls, url: str, api_key: str | None = None) -> "RealtimeClient":
        http = aiohttp.ClientSession()
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        try:
            ws = await http.ws_connect(url, headers=headers, max_msg_size=0)
        except Exception:
            await http.close()
            raise
        client = cls(ws, http)
        created = await client.recv()
        assert created["type"] == "session.created", created
        return client

    async def close(self) -> None:
        await self.ws.close()
        await self._http.close()

    async def __aenter__(self) -> "RealtimeClient":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    async def send(self, type: str, **fields: Any) -> None:
        await self.ws.send_str(json.dumps({"type": type, **fields}))

    async def send_raw(self, text: str) -> None:
        await self.ws.send_str(text)

    async def recv(self, timeout: float = 60) -> dict[str, Any]:
        msg = await self.ws.receive(timeout=timeout)
        if msg.type != aiohttp.WSMsgType.TEXT:
            raise ConnectionError(f"socket closed: {msg.type} {msg.data!r} {msg.extra!r}")
        event = json.loads(msg.data)
        self.events.append(event)
        return event

    async def wait_for(self, type: str, timeout: float = 120) -> dict[str, Any]:
        """Skip events until one of `type` arrives."""
        async def loop():
            while True:
                event = await self.recv(timeout)
                if event["type"] == type:
                    return event
        return await asyncio.wait_for(loop(), timeout)

    async def until_done(self, timeout: float = 300) -> list[dict[str, Any]]:
        """Every event up to and including the next response.done."""
        start = len(self.events)
        await self.wait_for("response.done", timeout)
        return self.events[start:]

    async def update_session(self, **session: Any) -> dict[str, Any]:
        await self.send("session.update", session=session)
        event = await self.recv()
        assert event["type"] == "session.updated", event
        return event["session"]

    async def append_audio(self, samples: np.ndarray, chunk_ms: int = 100, rate: int = 16000) -> None:
        pcm = (np.clip(samples, -1, 1) * 32767).astype("<i2")
        step = rate * chunk_ms // 1000
        for i in range(0, len(pcm), step):
            await self.send("input_audio_buffer.append", audio=base64.b64encode(pcm[i:i + step].tobytes()).decode())


def audio_of(events: list[dict[str, Any]]) -> np.ndarray:
    """All output audio deltas of a response, as int16 samples."""
    chunks = [np.frombuffer(base64.b64decode(e["delta"]), "<i2") for e in events
              if e["type"] == "response.output_audio.delta"]
    return np.concatenate(chunks) if chunks else np.zeros(0, np.int16)


def transcript_of(events: list[dict[str, Any]]) -> str:
    return "".join(e["delta"] for e in events if e["type"] == "response.output_audio_transcript.delta")


def speech_like(seconds: float, rate: int = 16000, seed: int = 0) -> np.ndarray:
    """A voiced, syllable-paced signal (stands in for speech where words do not matter)."""
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    f0 = 120 + 30 * np.sin(2 * np.pi * 0.5 * t)
    voiced = sum(np.sin(2 * np.pi * k * np.cumsum(f0) / rate) / k for k in range(1, 6))
    envelope = 0.5 * (1 + np.sin(2 * np.pi * 4 * t)) ** 2 / 4
    return (0.3 * voiced * envelope + 0.003 * rng.standard_normal(t.size)).astype(np.float32)
