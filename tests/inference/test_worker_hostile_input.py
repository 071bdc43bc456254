"""Hostile input against a real worker process (tiny-random): each case from issue 11.

Every refused event must get an `error` naming it (its `event_id`, the field), change
nothing, and leave the session usable: the next real turn still completes. The worker's log
must never hold a traceback or a credential.
"""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from tests.conftest import WorkerProcess
from tests.support.realtime_client import RealtimeClient


@pytest.fixture
def worker(omni_worker):
    """The shared worker: default limits, as a deployment has them."""
    return omni_worker


@pytest.fixture(autouse=True)
def no_traceback_or_key_in_the_log(worker):
    start = worker.log_path.stat().st_size
    yield
    new = worker.log_path.read_bytes()[start:].decode(errors="replace")
    assert "Traceback" not in new, new[-4000:]
    assert worker.api_key not in new


async def connect(worker: WorkerProcess) -> RealtimeClient:
    return await RealtimeClient.connect(worker.url, worker.api_key)


async def refused(client: RealtimeClient, payload: str | dict, code: str, event_id: str | None = None) -> dict:
    await client.send_raw(payload if isinstance(payload, str) else json.dumps(payload))
    event = await client.recv()
    assert event["type"] == "error", event
    assert event["error"]["code"] == code, event
    assert event["error"]["event_id"] == event_id, event
    return event["error"]


async def a_turn_completes(client: RealtimeClient, text: str = "hello") -> dict:
    """A real turn on the model: the session is usable and its conversation is not poisoned."""
    await client.send("conversation.item.create", item={
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]})
    await client.wait_for("conversation.item.done")
    await client.send("response.create", response={"max_output_tokens": 8})
    done = await client.wait_for("response.done")
    assert done["response"]["status"] in ("completed", "incomplete"), done
    return done


@pytest.mark.parametrize("payload, code", [
    ('{"type":[],"event_id":"e1"}', "unknown_event"),       # unhashable type
    ('{"type":{},"event_id":"e1"}', "unknown_event"),
    ('{"type":7,"event_id":"e1"}', "unknown_event"),
    ('{"type":null,"event_id":"e1"}', "unknown_event"),
    ('{"event_id":"e1","x":' + "[" * 1000 + "]" * 1000 + "}", "event_too_deep"),  # 2 KB, RecursionError before
])
async def test_one_line_events_that_ended_the_session(worker, payload, code):
    async with await connect(worker) as c:
        await refused(c, payload, code, event_id=None if code == "event_too_deep" else "e1")
        await a_turn_completes(c)


async def test_a_surrogate_event_id_is_echoed_as_sent_so_the_client_can_match_it(worker):
    async with await connect(worker) as c:
        for payload, event_id in (('{"type":"bogus","event_id":"\\ud800"}', "\ud800"),
                                  ('{"type":"input_audio_buffer.commit","event_id":"c-\\udc80-1"}', "c-\udc80-1")):
            err = await refused(c, payload, "invalid_event", event_id=event_id)
            assert err["param"] == "event_id" and "not valid Unicode" in err["message"]
        await c.send_raw('{"type":"bogus","event_id":"\\udfff"}')
        frame = await c.ws.receive()  # plain ASCII JSON: the id travels as a \\uXXXX escape
        assert frame.data.isascii() and '"event_id": "\\udfff"' in frame.data
        await a_turn_completes(c)


async def test_a_lone_surrogate_in_user_text_is_refused_and_does_not_poison_the_conversation(worker):
    async with await connect(worker) as c:
        err = await refused(c, '{"type":"conversation.item.create","event_id":"bad-text","item":{"id":"item_bad",'
                               '"type":"message","role":"user","content":[{"type":"input_text","text":"hi \\udc80"}]}}',
                            "invalid_event", event_id="bad-text")
        assert err["param"] == "item.content.0.text"
        await refused(c, {"type": "conversation.item.retrieve", "item_id": "item_bad", "event_id": "r"},
                      "item_not_found", event_id="r")  # nothing was kept
        for _ in range(2):  # before the fix every later response failed with engine_error
            await a_turn_completes(c)


async def test_a_lone_surrogate_in_instructions_changes_nothing(worker):
    async with await connect(worker) as c:
        err = await refused(c, '{"type":"session.update","event_id":"u1","session":{"instructions":"be \\ud834 kind"}}',
                            "invalid_event", event_id="u1")
        assert err["param"] == "session.instructions"
        assert (await c.update_session())["instructions"] == ""
        await refused(c, '{"type":"response.create","event_id":"u2","response":{"instructions":"\\ud800"}}',
                      "invalid_event", event_id="u2")
        await a_turn_completes(c)


async def test_a_valid_surrogate_pair_is_ordinary_text(worker):
    async with await connect(worker) as c:
        await c.send_raw('{"type":"conversation.item.create","item":{"type":"message","role":"user",'
                         '"content":[{"type":"input_text","text":"smile \\ud83d\\ude00"}]}}')
        added = await c.wait_for("conversation.item.added")
        assert added["item"]["content"][0]["text"] == "smile \U0001F600"


async def test_deep_metadata_is_refused_and_the_next_response_is_done(worker):
    async with await connect(worker) as c:
        deep = '{"type":"response.create","event_id":"m1","response":{"metadata":' + '{"a":' * 500 + "1" + "}" * 500 + "}}"
        await refused(c, deep, "event_too_deep", event_id=None)  # refused before parsing: no id known
        await c.send("response.create", response={"metadata": {"a": {"b": [1, 2]}}, "max_output_tokens": 4})
        done = await c.wait_for("response.done")
        assert done["response"]["metadata"] == {"a": {"b": [1, 2]}}


async def test_the_event_size_limit_counts_utf8_bytes(worker):
    async with await connect(worker) as c:
        text = "é" * 1_200_000  # 1.2 M characters, 2.4 MB of UTF-8: over 2 MiB
        payload = json.dumps({"type": "conversation.item.create", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}}, ensure_ascii=False)
        assert len(payload) < 2 * 1024 * 1024 < len(payload.encode())
        err = await refused(c, payload, "event_too_large")
        assert "bytes" in err["message"]
        await a_turn_completes(c)


async def test_a_long_text_item_is_refused(worker):
    async with await connect(worker) as c:
        await refused(c, {"type": "conversation.item.create", "event_id": "t1", "item": {
            "type": "message", "role": "user", "content": [{"type": "input_text", "text": "word " * 32_000}]}},
            "text_too_long", event_id="t1")
        await refused(c, {"type": "conversation.item.create", "event_id": "t2", "item": {
            "type": "function_call_output", "call_id": "c1", "output": "x" * 40_000}}, "text_too_long", event_id="t2")
        await refused(c, {"type": "response.create", "event_id": "t3", "response": {"input": [
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "y" * 40_000}]}]}},
            "text_too_long", event_id="t3")
        await a_turn_completes(c)


def tool(name: str, padding: int = 0) -> dict:
    return {"type": "function", "name": name, "description": "d" * padding,
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}


async def test_tools_are_bounded_in_number_and_size(worker):
    async with await connect(worker) as c:
        err = await refused(c, {"type": "session.update", "event_id": "s1",
                                "session": {"tools": [tool(f"t{i}") for i in range(1000)]}},
                            "too_many_tools", event_id="s1")
        assert err["param"] == "session.tools"
        await refused(c, {"type": "session.update", "event_id": "s2", "session": {"tools": [tool("big", 20_000)]}},
                      "tool_schema_too_large", event_id="s2")
        await refused(c, {"type": "response.create", "event_id": "s3",
                          "response": {"tools": [tool(f"t{i}") for i in range(100)]}}, "too_many_tools", event_id="s3")
        assert (await c.update_session())["tools"] == []
        await a_turn_completes(c)


@pytest.mark.parametrize("event, param", [
    ({"type": "response.create", "response": {"max_output_tokens": -1}}, "response.max_output_tokens"),
    ({"type": "response.create", "response": {"max_output_tokens": 0}}, "response.max_output_tokens"),
    ({"type": "response.create", "response": {"max_output_tokens": "lots"}}, "response.max_output_tokens"),
    ({"type": "session.update", "session": {"max_output_tokens": -5}}, "session.max_output_tokens"),
    ({"type": "response.create", "response": {"temperature": 9.5}}, "response.temperature"),
    ({"type": "session.update", "session": {"temperature": -1}}, "session.temperature"),
    ({"type": "conversation.item.truncate", "item_id": "x", "content_index": -1, "audio_end_ms": 0}, "content_index"),
])
async def test_out_of_range_numbers_are_refused(worker, event, param):
    async with await connect(worker) as c:
        err = await refused(c, {**event, "event_id": "n1"}, "invalid_event", event_id="n1")
        assert err["param"].startswith(param), err
        await a_turn_completes(c)


@pytest.mark.parametrize("rate", [0, 8000, 44100, -16000])
async def test_only_16k_and_24k_input_rates(worker, rate):
    async with await connect(worker) as c:
        await refused(c, {"type": "session.update", "event_id": "r1", "session": {
            "audio": {"input": {"format": {"type": "audio/pcm", "rate": rate}}}}}, "unsupported_audio_format",
            event_id="r1")
        session = await c.update_session(audio={"input": {"format": {"type": "audio/pcm", "rate": 24000}}})
        assert session["audio"]["input"]["format"]["rate"] == 24000


@pytest.mark.parametrize("threshold_field", [
    {"threshold": 3.0}, {"silence_duration_ms": -1}, {"prefix_padding_ms": 10**9}])
async def test_turn_detection_ranges(worker, threshold_field):
    async with await connect(worker) as c:
        await refused(c, {"type": "session.update", "event_id": "v1", "session": {"audio": {"input": {
            "turn_detection": {"type": "server_vad", **threshold_field}}}}}, "invalid_session", event_id="v1")


async def test_a_long_authorization_header_never_reaches_the_log(worker):
    key = worker.api_key
    async with aiohttp.ClientSession() as http:
        for value in (f"Bearer {key}" + "x" * 9000, f"Bearer {key}x", f"Basic {key}", key):
            async with http.get(f"{worker.http_url}/v1/models", headers={"Authorization": value}) as r:
                assert r.status in (400, 401), (value[:40], r.status)
    await asyncio.sleep(0.3)  # the autouse fixture then reads the log: no key, no traceback


def test_log_filters_redact_credentials_even_in_aiohttp_debug_tracebacks(caplog):
    import logging
    from aiohttp.http_exceptions import LineTooLong
    from inference.logging_filters import install as install_log_filters
    secret = "sk-live-0123456789abcdef"
    root = logging.getLogger()
    root.addHandler(caplog.handler)
    try:
        install_log_filters([secret])
        caplog.set_level(logging.DEBUG)
        aiohttp_log = logging.getLogger("aiohttp.server")
        try:
            raise LineTooLong(f"Bearer {secret}" + "x" * 9000, "8190")
        except LineTooLong as e:
            aiohttp_log.error("Error handling request from %s", "127.0.0.1", exc_info=e)
        try:
            raise RuntimeError(f"headers: {{'Authorization': 'Bearer {secret}', 'X-Api-Key': '{secret}'}}")
        except RuntimeError:
            logging.getLogger("inference.test").exception("failed with %s", secret[:20] + secret[20:])
    finally:
        root.removeHandler(caplog.handler)
    text = caplog.text + "".join(r.exc_text or "" for r in caplog.records)
    assert secret not in text and secret[:10] not in text
    assert "[redacted]" in text
    bad_request = next(r for r in caplog.records if r.name == "aiohttp.server")
    assert bad_request.levelname == "DEBUG" and bad_request.exc_info is None  # a client's fault: one line
