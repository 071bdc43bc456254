"""The omni worker end to end over a real socket, on the real reference engine (tiny-random)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

import aiohttp
import numpy as np

from tests.conftest import REPO, TINY_ENGINE_ARGS, free_port
from tests.support.realtime_client import RealtimeClient, audio_of, speech_like, transcript_of

# tiny-random has random weights: its words are noise, but the path is the real one.
BOUNDED = {"max_output_tokens": 24}


async def connect(worker) -> RealtimeClient:
    return await RealtimeClient.connect(worker.url, worker.api_key)


async def speak(client: RealtimeClient, seconds: float = 1.5, seed: int = 0) -> str:
    await client.append_audio(speech_like(seconds, seed=seed))
    await client.send("input_audio_buffer.commit")
    committed = await client.wait_for("input_audio_buffer.committed")
    await client.wait_for("conversation.item.done")
    return committed["item_id"]


async def test_health_and_models(omni_worker):
    async with aiohttp.ClientSession() as http:
        async with http.get(f"{omni_worker.http_url}/health") as r:
            assert r.status == 200
            health = await r.json()
        async with http.get(f"{omni_worker.http_url}/v1/models", headers=omni_worker.headers) as r:
            models = await r.json()
    assert health["status"] == "ready" and health["engine"] == "reference" and health["model"] == "tiny-random"
    assert health["capacity"] >= 1
    assert health["preset"] == "exact"  # the model's own computation unless --preset fast
    assert [m["id"] for m in models["data"]] == ["tiny-random"]


async def test_speech_in_streamed_audio_and_transcript_out(omni_worker):
    async with await connect(omni_worker) as c:
        await speak(c)
        await c.send("response.create", response=BOUNDED)
        events = await c.until_done()
    done = events[-1]["response"]
    assert done["status"] in ("completed", "incomplete")
    audio = audio_of(events)
    deltas = [i for i, e in enumerate(events) if e["type"] == "response.output_audio.delta"]
    assert len(deltas) >= 2, "audio must stream in several deltas"
    last_content = max(i for i, e in enumerate(events) if e["type"].endswith(".delta"))
    assert deltas[0] < last_content, "first audio must leave before the reply is finished"
    assert audio.size > 0 and np.abs(audio).max() > 0
    assert transcript_of(events) == done["output"][0]["content"][0]["transcript"]
    usage = done["usage"]
    assert usage["input_token_details"]["audio_tokens"] > 0 and usage["output_tokens"] > 0


async def test_cancel_mid_response(omni_worker):
    async with await connect(omni_worker) as c:
        await speak(c)
        await c.send("response.create", response={"max_output_tokens": 200})
        await c.wait_for("response.output_audio.delta")
        await c.send("response.cancel")
        events = await c.until_done()
        assert events[-1]["response"]["status"] == "cancelled"
        # the session goes on: the next turn is answered
        await speak(c, seed=1)
        await c.send("response.create", response=BOUNDED)
        events = await c.until_done()
        assert events[-1]["response"]["status"] in ("completed", "incomplete")


async def test_truncate_to_what_was_heard(omni_worker):
    async with await connect(omni_worker) as c:
        await speak(c)
        await c.send("response.create", response=BOUNDED)
        events = await c.until_done()
        item = events[-1]["response"]["output"][0]
        heard_ms = len(audio_of(events)) * 1000 // 24000 // 2
        await c.send("conversation.item.truncate", item_id=item["id"], content_index=0, audio_end_ms=heard_ms)
        truncated = await c.wait_for("conversation.item.truncated")
        assert truncated["audio_end_ms"] == heard_ms
        await c.send("conversation.item.retrieve", item_id=item["id"])
        kept = (await c.wait_for("conversation.item.retrieved"))["item"]
    full = item["content"][0]["transcript"]
    assert len(kept["content"][0]["transcript"]) <= len(full)


async def test_three_turn_context_grows(omni_worker):
    input_tokens = []
    async with await connect(omni_worker) as c:
        await c.update_session(instructions="You are a helpful voice assistant.")
        for turn in range(3):
            await speak(c, seconds=1.0, seed=turn)
            await c.send("response.create", response=BOUNDED)
            events = await c.until_done()
            input_tokens.append(events[-1]["response"]["usage"]["input_tokens"])
    # each turn's prompt holds every earlier turn (user audio and the assistant's reply)
    assert input_tokens[0] < input_tokens[1] < input_tokens[2]


async def test_tool_call_round_trip(omni_worker):
    tool = {"type": "function", "name": "get_weather", "description": "Weather for a city",
            "parameters": {"type": "object", "properties": {"unit": {"type": "string", "enum": ["c", "f"]}},
                           "required": ["unit"]}}
    async with await connect(omni_worker) as c:
        await c.update_session(tools=[tool])
        await speak(c)
        await c.send("response.create", response={**BOUNDED, "tool_choice": {"type": "function",
                                                                              "name": "get_weather"}})
        events = await c.until_done()
        call = next(e["item"] for e in events if e["type"] == "response.output_item.done"
                    and e["item"]["type"] == "function_call")
        assert call["name"] == "get_weather"
        assert json.loads(call["arguments"])["unit"] in ("c", "f")
        await c.send("conversation.item.create", item={"type": "function_call_output", "call_id": call["call_id"],
                                                       "output": json.dumps({"temperature": 21})})
        await c.wait_for("conversation.item.done")
        await c.send("response.create", response=BOUNDED)
        events = await c.until_done()
    reply = events[-1]["response"]
    assert reply["status"] in ("completed", "incomplete")
    assert reply["output"][0]["type"] == "message" and audio_of(events).size > 0


async def test_openai_sdk_client_unchanged(omni_worker):
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=f"{omni_worker.http_url}/v1", api_key=omni_worker.api_key)
    async with client.realtime.connect(model="tiny-random") as conn:
        await conn.session.update(session={"type": "realtime", "output_modalities": ["audio"],
                                           "instructions": "Be brief."})
        await conn.conversation.item.create(item={"type": "message", "role": "user",
                                                  "content": [{"type": "input_text", "text": "Hello there"}]})
        await conn.response.create(response={"max_output_tokens": 16})
        audio_bytes, status = 0, None
        async for event in conn:
            if event.type == "response.output_audio.delta":
                audio_bytes += len(event.delta)
            elif event.type == "response.done":
                status = event.response.status
                break
            elif event.type == "error":
                raise AssertionError(event.error)
    assert status in ("completed", "incomplete") and audio_bytes > 0


async def test_health_is_503_until_warm(tmp_path):
    """The socket listens before the model is loaded and warmed; until then /health says 503."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "inference", "serve", "--model", "tiny-random",
                             "--insecure-no-auth", "--port", str(port), *TINY_ENGINE_ARGS],
                            cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    seen: list[tuple[int, str]] = []
    try:
        async with aiohttp.ClientSession() as http:
            deadline = time.monotonic() + 300
            while time.monotonic() < deadline and (not seen or seen[-1][0] != 200):
                try:
                    async with http.get(f"http://127.0.0.1:{port}/health") as r:
                        seen.append((r.status, (await r.json())["status"]))
                    if seen[-1][0] == 503 and len(seen) % 10 == 1:  # within the per-client request rate
                        async with http.get(f"http://127.0.0.1:{port}/v1/realtime") as r:
                            refused = r.status == 503 and (await r.json())["error"]["code"] == "not_ready"
                        if not refused:  # only if the worker became ready since /health said 503
                            async with http.get(f"http://127.0.0.1:{port}/health") as r:
                                assert r.status == 200, "/v1/realtime was not refused while loading"
                except aiohttp.ClientConnectionError:
                    pass
                await asyncio.sleep(0.02)
    finally:
        proc.terminate()
        proc.wait(30)
    assert seen[0] == (503, "loading"), seen[:3]
    assert seen[-1] == (200, "ready")
