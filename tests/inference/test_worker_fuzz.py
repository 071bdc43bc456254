"""A property-based fuzz of the wire protocol against a real worker process (tiny-random).

Hypothesis writes batches of client events: plausible ones (every client event type with
fields that may be right or wrong) and known-bad ones (not JSON, not an object, odd `type`
values, lone surrogates, nesting past the limit, events over the size limit, numbers out of
range, missing fields, bad audio). One fuzz session sends them all; after each batch it sends
a sentinel event whose `error` marks the end of the batch's answers. Meanwhile a control
session on the same worker runs real turns, one after another.

The properties, over at least `OMNI_FUZZ_EVENTS` events (10,000 in CI):
- every known-bad event gets an `error` (with its `event_id` when it parsed far enough to
  have one); no event ever gets `internal_error`;
- the fuzz socket is never closed (let alone without a reason), the worker log holds no traceback;
- every control turn completes; the worker's RSS grows by less than 50 MB.
The figures are printed (`pytest -s`) and written down in docs/hardening.md.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import string
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from PIL import Image

from inference.protocol import CLIENT_EVENTS
from tests.conftest import WorkerProcess
from tests.inference.conftest import SMALL_LIMITS

EVENTS = int(os.environ.get("OMNI_FUZZ_EVENTS", "10000"))
BATCH = 50
BATCHES_PER_SESSION = 10
MAX_EVENT_BYTES = int(SMALL_LIMITS["OMNI_LIMIT_MAX_EVENT_BYTES"])
MAX_DEPTH = 32
RSS_GROWTH_LIMIT_MB = 50

# --------------------------------------------------------------------------- strategies

ids = st.text(string.ascii_letters + string.digits + "_-", min_size=1, max_size=16)
text = st.text(max_size=120)  # Hypothesis leaves out surrogates: those are the bad cases below
json_leaf = st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.floats(allow_nan=False,
                                                                                  allow_infinity=False) | text
json_value = st.recursive(json_leaf, lambda inner: st.lists(inner, max_size=4)
                          | st.dictionaries(st.text(max_size=8), inner, max_size=4), max_leaves=12)
pcm = st.binary(max_size=3200).map(lambda b: base64.b64encode(b).decode())  # odd lengths are bad audio
modalities = st.lists(st.sampled_from(["audio", "text", "video"]), max_size=2)
max_tokens = st.integers(-3, 10**6) | st.just("inf")
part = st.fixed_dictionaries(
    {"type": st.sampled_from(["input_text", "input_audio", "output_text", "output_audio", "text", "audio", "x"])},
    optional={"text": text, "audio": pcm, "transcript": text})
item = st.one_of(
    st.fixed_dictionaries({"type": st.just("message"), "role": st.sampled_from(["user", "assistant", "system", "x"])},
                          optional={"id": ids, "content": st.lists(part, max_size=3),
                                    "status": st.sampled_from(["completed", "incomplete", "x"])}),
    st.fixed_dictionaries({"type": st.just("function_call"), "call_id": ids, "name": ids},
                          optional={"arguments": text, "id": ids}),
    st.fixed_dictionaries({"type": st.just("function_call_output"), "call_id": ids, "output": text},
                          optional={"id": ids}),
    json_value,
)
tool = st.fixed_dictionaries({"type": st.just("function"), "name": ids},
                             optional={"description": text, "parameters": json_value})
tool_choice = st.sampled_from(["auto", "none", "required", "x"]) | st.fixed_dictionaries(
    {"type": st.just("function"), "name": ids})
turn_detection = st.none() | st.fixed_dictionaries(
    {"type": st.sampled_from(["server_vad", "semantic_vad"])},
    optional={"threshold": st.floats(-1, 2), "silence_duration_ms": st.integers(-100, 3000),
              "prefix_padding_ms": st.integers(-100, 3000), "create_response": st.booleans(),
              "interrupt_response": st.booleans()})
audio_config = st.fixed_dictionaries({}, optional={
    "input": st.fixed_dictionaries({}, optional={
        "format": st.fixed_dictionaries({"type": st.sampled_from(["audio/pcm", "audio/pcmu"])},
                                        optional={"rate": st.sampled_from([16000, 24000, 0, 8000, -1])}),
        "turn_detection": turn_detection, "transcription": json_value}),
    "output": st.fixed_dictionaries({}, optional={"voice": ids, "speed": st.floats(0, 3)})})
input_video = st.none() | st.fixed_dictionaries({"type": st.sampled_from(["with_speech", "x"])})
session = st.fixed_dictionaries({}, optional={
    "instructions": text, "output_modalities": modalities, "tools": st.lists(tool, max_size=3),
    "tool_choice": tool_choice, "max_output_tokens": max_tokens, "temperature": st.floats(-1, 3),
    "audio": audio_config, "input_video": input_video})
# a 16×16 grey JPEG, and what a frame must not be
_jpeg = io.BytesIO()
Image.new("RGB", (16, 16), (128, 128, 128)).save(_jpeg, "JPEG")
JPEG_16 = "data:image/jpeg;base64," + base64.b64encode(_jpeg.getvalue()).decode()
frame_url = st.sampled_from([JPEG_16, "data:image/jpeg;base64,", "data:image/gif;base64,R0lGOD", "https://x/y.jpg"]) \
    | text
response = st.fixed_dictionaries({}, optional={
    "instructions": text, "output_modalities": modalities, "max_output_tokens": max_tokens,
    "metadata": st.dictionaries(st.text(max_size=8), json_value, max_size=3),
    "conversation": st.sampled_from(["auto", "none"]), "input": st.lists(item, max_size=2),
    "tools": st.lists(tool, max_size=2), "tool_choice": tool_choice})
BODIES: dict[str, st.SearchStrategy[dict[str, Any]]] = {
    "session.update": st.fixed_dictionaries({"session": session}),
    "input_audio_buffer.append": st.fixed_dictionaries({"audio": pcm}),
    "input_video_buffer.append": st.fixed_dictionaries({"image_url": frame_url},
                                                       optional={"audio_ms": st.integers(-10, 10**6)}),
    "input_audio_buffer.commit": st.just({}),
    "input_audio_buffer.clear": st.just({}),
    "conversation.item.create": st.fixed_dictionaries({"item": item},
                                                      optional={"previous_item_id": ids | st.just("root")}),
    "conversation.item.truncate": st.fixed_dictionaries(
        {"item_id": ids, "audio_end_ms": st.integers(-10, 10**6)},
        optional={"content_index": st.integers(-2, 3), "audio_transcript": text}),
    "conversation.item.delete": st.fixed_dictionaries({"item_id": ids}),
    "conversation.item.retrieve": st.fixed_dictionaries({"item_id": ids}),
    "response.create": st.fixed_dictionaries({}, optional={"response": response}),
    "response.cancel": st.fixed_dictionaries({}, optional={"response_id": ids}),
}
assert set(BODIES) == set(CLIENT_EVENTS)
plausible = st.sampled_from(sorted(BODIES)).flatmap(lambda t: BODIES[t].map(lambda body: {"type": t, **body}))


@dataclass
class Fuzzed:
    """One event to send. `bad`: it must get an `error`. `text` set: sent as is, with no event_id."""
    event: dict[str, Any] | None = None
    text: str | None = None
    bad: bool = False
    kind: str = "plausible"


def _not_json(s: str) -> bool:
    try:
        json.loads(s)
        return False
    except ValueError:
        return True


def _nest(depth: int) -> Any:
    value: Any = 1
    for i in range(depth):
        value = [value] if i % 2 else {"a": value}
    return value


def _with_surrogate(event: dict[str, Any], where: int, code: int) -> dict[str, Any]:
    s = "x" + chr(code) + "y"
    targets = [("instructions", lambda e: e.setdefault("session", {}).__setitem__("instructions", s)),
               ("key", lambda e: e.__setitem__(s, 1)),
               ("nested", lambda e: e.__setitem__("extra", {"deep": [0, s]}))]
    event = json.loads(json.dumps(event))
    targets[where % len(targets)][1](event)
    return event


surrogates = st.integers(0xD800, 0xDFFF)
odd_types = (st.text(max_size=30).filter(lambda t: t not in CLIENT_EVENTS) | st.integers() | st.none()
             | st.booleans() | st.lists(json_leaf, max_size=2) | st.dictionaries(st.text(max_size=4), json_leaf,
                                                                                  max_size=2))
out_of_range = st.one_of(
    st.integers(-(10**6), 0).map(lambda n: {"type": "response.create", "response": {"max_output_tokens": n}}),
    st.floats(2.01, 1e6).map(lambda t: {"type": "response.create", "response": {"temperature": t}}),
    st.integers(-(10**6), 10**6).filter(lambda r: r not in (16000, 24000)).map(
        lambda r: {"type": "session.update", "session": {"audio": {"input": {"format": {"rate": r}}}}}),
    st.integers(-(10**6), -1).map(lambda n: {"type": "conversation.item.truncate", "item_id": "i",
                                             "content_index": 0, "audio_end_ms": n}),
    st.floats(1.01, 100).map(lambda t: {"type": "session.update",
                                        "session": {"audio": {"input": {"turn_detection": {"threshold": t}}}}}),
)
missing_fields = st.sampled_from([
    {"type": "conversation.item.create"}, {"type": "conversation.item.truncate", "item_id": "i"},
    {"type": "input_audio_buffer.append"}, {"type": "session.update"},
    {"type": "conversation.item.create", "item": {"type": "message"}},
    {"type": "conversation.item.create", "item": {"type": "function_call_output", "output": "x"}},
])
bad_audio = st.sampled_from(["%%%", "AAE", "AQID", "not base64!"]).map(
    lambda a: {"type": "input_audio_buffer.append", "audio": a})
bad = st.one_of(
    st.text(min_size=1, max_size=80).filter(_not_json).map(lambda s: Fuzzed(text=s, bad=True, kind="not_json")),
    json_value.filter(lambda v: not isinstance(v, dict)).map(
        lambda v: Fuzzed(text=json.dumps(v), bad=True, kind="not_object")),
    st.tuples(plausible, odd_types).map(lambda p: Fuzzed(event={**p[0], "type": p[1]}, bad=True, kind="odd_type")),
    st.tuples(plausible, st.integers(0, 2), surrogates).map(
        lambda p: Fuzzed(event=_with_surrogate(*p), bad=True, kind="surrogate")),
    st.integers(MAX_DEPTH + 1, 300).map(lambda d: Fuzzed(
        text=json.dumps({"type": "response.create", "response": {"metadata": _nest(d)}}), bad=True, kind="too_deep")),
    st.integers(MAX_EVENT_BYTES + 1, 3 * MAX_EVENT_BYTES).map(lambda n: Fuzzed(
        text=json.dumps({"type": "input_audio_buffer.append", "audio": "A" * n}), bad=True, kind="too_large")),
    out_of_range.map(lambda e: Fuzzed(event=e, bad=True, kind="out_of_range")),
    missing_fields.map(lambda e: Fuzzed(event=e, bad=True, kind="missing_field")),
    bad_audio.map(lambda e: Fuzzed(event=e, bad=True, kind="bad_audio")),
)
# half plausible, half known-bad (`a | b` would weigh each of bad's branches like plausible)
fuzzed = st.booleans().flatmap(lambda is_bad: bad if is_bad else plausible.map(lambda e: Fuzzed(event=e)))
batches = st.lists(fuzzed, min_size=BATCH, max_size=BATCH)

# --------------------------------------------------------------------------- the run


@dataclass
class Tally:
    events: int = 0
    bad: int = 0
    bad_unanswered: list[str] = field(default_factory=list)
    internal_errors: list[dict] = field(default_factory=list)
    closes: list[str] = field(default_factory=list)
    silent_closes: int = 0
    errors_by_code: dict[str, int] = field(default_factory=dict)
    control_turns: int = 0
    control_completed: int = 0
    control_failures: list[str] = field(default_factory=list)


class Background:
    """An event loop on a thread: Hypothesis drives a sync test, the clients live here."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()

    def run(self, coro, timeout: float | None = None):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)


class FuzzSession:
    def __init__(self, worker: WorkerProcess, tally: Tally) -> None:
        self._worker, self._tally = worker, tally
        self._http: aiohttp.ClientSession | None = None
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._serial = 0
        self._batches = 0

    async def _connect(self) -> None:
        self._http = self._http or aiohttp.ClientSession()
        self._ws = await self._http.ws_connect(self._worker.url, headers=self._worker.headers, max_msg_size=0)
        assert json.loads((await self._ws.receive()).data)["type"] == "session.created"

    async def exchange(self, batch: list[Fuzzed]) -> None:
        self._batches += 1
        if self._ws is not None and self._batches % BATCHES_PER_SESSION == 0:
            await self._ws.close()  # a fresh conversation now and then: a full one refuses most events
        if self._ws is None or self._ws.closed:
            await self._connect()
        ws, tally = self._ws, self._tally
        expected_ids: dict[str, str] = {}  # event_id -> kind, for bad events that carry one
        anonymous_bad = 0
        for fuzzed in batch:
            self._serial += 1
            if fuzzed.text is not None:
                payload = fuzzed.text
                anonymous_bad += fuzzed.bad
            else:
                event_id = f"{'bad' if fuzzed.bad else 'ev'}-{self._serial}"
                payload = json.dumps({**fuzzed.event, "event_id": event_id})
                if fuzzed.bad:
                    expected_ids[event_id] = fuzzed.kind
            await ws.send_str(payload)
            tally.events += 1
            tally.bad += fuzzed.bad
        sentinel = f"sentinel-{self._serial}"
        await ws.send_str(json.dumps({"type": "conversation.item.retrieve", "item_id": "no-such-item",
                                      "event_id": sentinel}))
        anonymous_errors = 0
        while True:
            msg = await ws.receive(timeout=120)
            if msg.type != aiohttp.WSMsgType.TEXT:
                reason = f"{msg.type.name} code={ws.close_code} extra={msg.extra!r}"
                tally.closes.append(reason)
                if not ws.close_code or ws.close_code == 1006:
                    tally.silent_closes += 1
                return
            event = json.loads(msg.data)
            if event["type"] != "error":
                continue
            error = event["error"]
            tally.errors_by_code[error["code"]] = tally.errors_by_code.get(error["code"], 0) + 1
            if error["code"] == "internal_error":
                tally.internal_errors.append(error)
            if error["event_id"] == sentinel:
                break
            if error["event_id"] is None:
                anonymous_errors += 1
            expected_ids.pop(error["event_id"], None)
        tally.bad_unanswered.extend(sorted(expected_ids.values()))
        if anonymous_errors < anonymous_bad:  # refused before parsing: not JSON, too deep, too large
            tally.bad_unanswered.append(f"{anonymous_bad - anonymous_errors} events without an event_id")

    async def close(self) -> None:
        if self._ws is not None:
            await self._ws.close()
        if self._http is not None:
            await self._http.close()


async def control_session(worker: WorkerProcess, tally: Tally, stop: asyncio.Event) -> None:
    """Real turns, one after another, until told to stop: each must complete."""
    async with aiohttp.ClientSession() as http:
        ws = await http.ws_connect(worker.url, headers=worker.headers, max_msg_size=0)
        await ws.receive()
        turn = 0
        while not stop.is_set():
            turn += 1
            tally.control_turns += 1
            await ws.send_json({"type": "conversation.item.create", "item": {
                "id": f"item_user_{turn}", "type": "message", "role": "user",
                "content": [{"type": "input_text", "text": f"turn {turn}: how are you?"}]}})
            await ws.send_json({"type": "response.create"})
            try:
                while True:
                    event = await ws.receive_json(timeout=120)
                    if event["type"] == "error":
                        tally.control_failures.append(json.dumps(event["error"]))
                    if event["type"] == "response.done":
                        break
            except (TypeError, asyncio.TimeoutError) as e:  # closed, or no answer
                tally.control_failures.append(f"turn {turn}: {e!r}")
                return
            response = event["response"]
            if response["status"] in ("completed", "incomplete"):
                tally.control_completed += 1
            else:
                tally.control_failures.append(f"turn {turn}: {response['status']} {response.get('status_details')}")
            for item_id in [f"item_user_{turn}"] + [o["id"] for o in response["output"]]:  # keep it short
                await ws.send_json({"type": "conversation.item.delete", "item_id": item_id})
        await ws.close()


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS")


def test_fuzzed_events_each_get_an_error_and_break_nothing(small_limits_worker):
    background = Background()
    tally = Tally()
    fuzz = FuzzSession(small_limits_worker, tally)
    stop = asyncio.Event()
    control = asyncio.run_coroutine_threadsafe(control_session(small_limits_worker, tally, stop), background.loop)
    while tally.control_turns < 2 and not control.done():  # warm: the first replies allocate for good
        time.sleep(0.1)
    rss_before = rss_mb(small_limits_worker.proc.pid)
    started = time.monotonic()

    @settings(max_examples=-(-EVENTS // BATCH), deadline=None, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(batches)
    def fuzz_batch(batch: list[Fuzzed]) -> None:
        background.run(fuzz.exchange(batch), timeout=300)

    try:
        fuzz_batch()
    finally:
        fuzz_s = time.monotonic() - started
        background.loop.call_soon_threadsafe(stop.set)
        control.result(timeout=180)
        background.run(fuzz.close())
        background.close()
    rss_growth = rss_mb(small_limits_worker.proc.pid) - rss_before
    log = small_limits_worker.log_path.read_text(errors="replace")
    tracebacks = log.count("Traceback")
    print(f"\nfuzz: {tally.events} events ({tally.bad} known-bad) in {fuzz_s:.0f} s; "
          f"bad without an error: {len(tally.bad_unanswered)}; internal_error: {len(tally.internal_errors)}; "
          f"tracebacks: {tracebacks}; socket closes: {len(tally.closes)} (silent {tally.silent_closes}); "
          f"control session: {tally.control_completed}/{tally.control_turns} turns completed; "
          f"worker RSS {rss_before:.0f} MB -> growth {rss_growth:+.1f} MB")
    print("errors by code: " + ", ".join(f"{k} {v}" for k, v in sorted(tally.errors_by_code.items())))
    assert tally.events >= EVENTS
    assert not tally.bad_unanswered, tally.bad_unanswered[:20]
    assert not tally.internal_errors, tally.internal_errors[:5]
    assert tracebacks == 0, log[log.index("Traceback") - 300:][:3000]
    assert not tally.closes, tally.closes
    assert not tally.control_failures, tally.control_failures[:5]
    assert tally.control_turns >= 1 and tally.control_completed == tally.control_turns
    assert rss_growth < RSS_GROWTH_LIMIT_MB
