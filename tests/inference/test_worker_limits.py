"""Limits and bad input against a real worker process (tiny-random) with small limits.

Every case checks the clear error *and* that the session is still usable afterwards.
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
import subprocess
import sys

import aiohttp
import numpy as np
import pytest

from tests.conftest import WorkerProcess
from tests.support.realtime_client import RealtimeClient

LIMIT_ENV = {
    "OMNI_LIMIT_MAX_EVENT_BYTES": "65536",
    "OMNI_LIMIT_MAX_EVENT_AUDIO_S": "1",
    "OMNI_LIMIT_MAX_TURN_AUDIO_S": "3",
    "OMNI_LIMIT_IDLE_TIMEOUT_S": "3",
}


@pytest.fixture(scope="module")
def worker(tmp_path_factory):
    w = WorkerProcess(tmp_path_factory.mktemp("limits"), api_key="secret-key", args=("--max-sessions", "2"),
                      env=LIMIT_ENV).start()
    yield w
    w.kill()


async def connect(worker: WorkerProcess) -> RealtimeClient:
    return await RealtimeClient.connect(worker.url, worker.api_key)


async def error_for(client: RealtimeClient, payload: str | dict, code: str) -> dict:
    if isinstance(payload, dict):
        await client.send(**payload)
    else:
        await client.send_raw(payload)
    event = await client.recv()
    assert event["type"] == "error", event
    assert event["error"]["code"] == code, event
    assert event["error"]["message"]
    return event["error"]


async def still_usable(client: RealtimeClient) -> None:
    session = await client.update_session(instructions="still here")
    assert session["instructions"] == "still here"


def b64_pcm(samples: int) -> str:
    return base64.b64encode(np.zeros(samples, "<i2").tobytes()).decode()


async def test_malformed_and_unknown_events(worker):
    async with await connect(worker) as c:
        await error_for(c, "{not json", "invalid_json")
        await error_for(c, "[1, 2]", "invalid_event")
        err = await error_for(c, {"type": "response.explode", "event_id": "e1"}, "unknown_event")
        assert err["event_id"] == "e1"
        await error_for(c, {"type": "conversation.item.truncate", "item_id": "x"}, "invalid_event")
        await error_for(c, {"type": "conversation.item.delete", "item_id": "nope"}, "item_not_found")
        await still_usable(c)


async def test_bad_audio(worker):
    async with await connect(worker) as c:
        await error_for(c, {"type": "input_audio_buffer.append", "audio": "%%% not base64"}, "invalid_audio")
        await error_for(c, {"type": "input_audio_buffer.append", "audio": base64.b64encode(b"\x01\x02\x03").decode()},
                        "invalid_audio")
        await error_for(c, {"type": "input_audio_buffer.commit"}, "input_audio_buffer_commit_empty")
        await still_usable(c)


async def test_unsupported_formats_change_nothing(worker):
    async with await connect(worker) as c:
        await error_for(c, {"type": "session.update", "session": {
            "instructions": "must not stick",
            "audio": {"input": {"format": {"type": "audio/pcm", "rate": 8000}}}}}, "unsupported_audio_format")
        await error_for(c, {"type": "session.update", "session": {
            "audio": {"input": {"format": {"type": "audio/pcmu"}}}}}, "unsupported_audio_format")
        await error_for(c, {"type": "session.update", "session": {
            "audio": {"output": {"format": {"type": "audio/pcm", "rate": 16000}}}}}, "unsupported_audio_format")
        session = await c.update_session()
        assert session["instructions"] == ""
        assert session["audio"]["input"]["format"] == {"type": "audio/pcm", "rate": 16000}


async def test_audio_per_event_and_per_turn(worker):
    async with await connect(worker) as c:
        await error_for(c, {"type": "input_audio_buffer.append", "audio": b64_pcm(16000 + 1600)}, "audio_too_long")
        for _ in range(3):  # 3 s: exactly the turn limit
            await c.send("input_audio_buffer.append", audio=b64_pcm(16000))
        await error_for(c, {"type": "input_audio_buffer.append", "audio": b64_pcm(1600)}, "input_audio_buffer_full")
        await c.send("input_audio_buffer.commit")
        committed = await c.recv()
        assert committed["type"] == "input_audio_buffer.committed"  # the buffer kept its 3 s


async def test_oversize_event_gets_an_error_and_the_session_survives(worker):
    async with await connect(worker) as c:
        big = json.dumps({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": "x" * 70000}]}})
        await error_for(c, big, "event_too_large")
        await still_usable(c)


async def test_idle_session_is_closed_with_a_reason(worker):
    async with await connect(worker) as c:
        event = await c.recv(timeout=10)
        assert event["type"] == "error" and event["error"]["code"] == "idle_timeout"
        msg = await c.ws.receive(timeout=5)
        assert msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)


async def test_capacity_is_refused_before_the_upgrade(worker):
    first, second = await connect(worker), await connect(worker)
    try:
        async with aiohttp.ClientSession() as http:
            with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
                await http.ws_connect(worker.url, headers=worker.headers)
            assert refused.value.status == 503
            async with http.get(f"{worker.http_url}/health") as r:
                health = await r.json()
            assert health["sessions"] == 2 and health["capacity"] == 2
            async with http.get(worker.url.replace("ws://", "http://"), headers=worker.headers) as r:
                assert r.status == 503
                assert (await r.json())["error"]["code"] == "capacity_exceeded"
    finally:
        await first.close()
        await second.close()
    await asyncio.sleep(0.2)
    async with await connect(worker) as c:  # a slot is free again
        await still_usable(c)


@pytest.mark.parametrize("header, code", [
    (None, "missing_api_key"),
    ("Bearer wrong-key", "invalid_api_key"),
    ("Basic c2VjcmV0LWtleQ==", "missing_api_key"),
])
async def test_auth_is_refused_before_the_upgrade(worker, header, code):
    headers = {"Authorization": header} if header else {}
    async with aiohttp.ClientSession() as http:
        async with http.get(worker.url.replace("ws://", "http://"), headers=headers) as r:
            assert r.status == 401
            assert (await r.json())["error"]["code"] == code
        async with http.get(f"{worker.http_url}/v1/models", headers=headers) as r:
            assert r.status == 401
        async with http.get(f"{worker.http_url}/v1/models", headers=worker.headers) as r:
            assert r.status == 200
            assert (await r.json())["data"][0]["id"] == "tiny-random"


def test_worker_refuses_to_start_without_a_key(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "OMNI_API_KEY"}
    result = subprocess.run([sys.executable, "-m", "inference", "serve", "--model", "tiny-random"],
                            env=env, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert "OMNI_API_KEY" in result.stderr and "--insecure-no-auth" in result.stderr


async def test_metrics_count_errors_and_sessions(worker):
    async with await connect(worker) as c:
        await error_for(c, "{broken", "invalid_json")
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{worker.http_url}/metrics") as r:
            text = await r.text()
    assert 'omni_errors_total{code="invalid_json"}' in text
    assert "omni_sessions_total" in text and "omni_time_to_first_audio_seconds_bucket" in text
