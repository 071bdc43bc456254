"""The engine interface over a worker's `/v1/realtime` socket, so the benchmarks' callers drive
any engine through the gateway, sessions and protocol of `omni-worker serve`.

`python -m bench.reference`'s callers (`harness.one_session`, `steady.steady_caller`) hand an
engine `GenerationRequest`s and read its deltas. `WorkerEngine` is such an engine as a client
of a running worker: `python -m bench.vllm_omni_side_by_side` runs the same callers against
the reference engine and vllm-omni, each behind a worker.

- A request with a `session_id` is one turn of a call: the call's socket opens at its first
  turn and stays open (`end_session` closes it). Each turn sends only what is new in the
  request's context, the items after its last `AssistantText` (the caller's audio as
  `input_audio_buffer.append` + `commit`, its text as a user `conversation.item.create`): the
  worker's conversation already holds the earlier turns and the replies it made. A request
  without one is a call of one turn on a socket of its own (a burst).
- `send_input(request)` sends the turn's input and waits for the worker to take it;
  `one_session` calls it before its clock starts (a caller's speech reaches a worker while
  they speak), then `generate` sends `response.create` and turns the reply's events into
  deltas: `AudioDelta` (the 24 kHz PCM16 deltas), `TextDelta` (the transcript) and a last
  `Finished` whose timings hold `audio_s`, `prefill_tokens` and `reused_tokens` (the
  response's usage).
- A reply that fails (`response.done` status `failed`, an `error`, a turn the worker refuses,
  a socket that breaks) ends as a `Finished` with the audio it made (none, mostly): the callers
  count it as a reply without audio and go on (a broken call opens a new socket at its next
  turn), and `errors` keeps each message and how often it came.
- The length of each reply's speech is the bench's to set in the worker's process
  (`harness.REPLY_SECONDS`, by request id): `send_input` moves a request's entry to the worker's
  session id, the id the worker's request carries (`GenerationRequest.session_id`).
"""

from __future__ import annotations

import asyncio
import base64
import collections
import json
from typing import Any, AsyncIterator

import aiohttp
import numpy as np

from bench.reference.harness import REPLY_SECONDS
from inference.engine import AssistantText, AudioDelta, Finished, GenerationRequest, TextDelta, UserAudio, UserText

OUTPUT_RATE = 24_000
APPEND_SECONDS = 1.0  # input audio per append event (the worker takes up to 10 s in one)
TIMEOUT_S = 600.0     # the longest a reply may take before the call gives up on it


def new_items(context: list) -> list:
    """The items of a turn the worker does not hold yet: those after the last reply."""
    last = max((i for i, item in enumerate(context) if isinstance(item, AssistantText)), default=-1)
    return context[last + 1:]


class WorkerCall:
    """One socket, one worker session: a call."""

    def __init__(self, http: aiohttp.ClientSession, ws: aiohttp.ClientWebSocketResponse, session_id: str) -> None:
        self._http = http
        self.ws = ws
        self.session_id = session_id

    @classmethod
    async def open(cls, url: str, instructions: str, api_key: str | None = None) -> WorkerCall:
        http = aiohttp.ClientSession()
        try:
            headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
            ws = await http.ws_connect(url, headers=headers, max_msg_size=0)
            call = cls(http, ws, "")
            created = await call.recv()
            if created["type"] != "session.created":
                raise ConnectionError(f"the worker did not open a session: {created}")
            call.session_id = created["session"]["id"]
            # the caller decides turns (the agent's mode): no server VAD, no transcription
            await call.send("session.update", session={"type": "realtime", "instructions": instructions,
                                                       "audio": {"input": {"turn_detection": None}}})
            await call.wait_for("session.updated")
            return call
        except BaseException:
            await http.close()
            raise

    async def send(self, type: str, **fields: Any) -> None:
        await self.ws.send_str(json.dumps({"type": type, **fields}))

    async def recv(self, timeout: float = TIMEOUT_S) -> dict[str, Any]:
        message = await self.ws.receive(timeout=timeout)
        if message.type != aiohttp.WSMsgType.TEXT:
            raise ConnectionError(f"the worker closed the socket: {message.type} {message.data!r}")
        return json.loads(message.data)

    async def wait_for(self, type: str) -> dict[str, Any]:
        while True:
            event = await self.recv()
            if event["type"] == type:
                return event
            if event["type"] == "error":
                raise RuntimeError(f"the worker refused the turn: {event['error']}")

    async def send_turn(self, items: list) -> None:
        """The caller's new items, each taken by the worker before the next."""
        for item in items:
            if isinstance(item, UserAudio):
                pcm = (np.clip(item.audio, -1, 1) * 32767).astype("<i2")
                step = int(16_000 * APPEND_SECONDS)
                for start in range(0, len(pcm), step):
                    await self.send("input_audio_buffer.append",
                                    audio=base64.b64encode(pcm[start:start + step].tobytes()).decode())
                await self.send("input_audio_buffer.commit")
            elif isinstance(item, UserText):
                await self.send("conversation.item.create", item={
                    "type": "message", "role": "user", "content": [{"type": "input_text", "text": item.text}]})
            else:
                raise ValueError(f"a caller's turn holds user audio and text, not {type(item).__name__}")
            await self.wait_for("conversation.item.done")

    async def respond(self, max_output_tokens: int | None, errors: collections.Counter) -> AsyncIterator:
        """`response.create`, then the reply's deltas, a Finished last."""
        response = {} if max_output_tokens is None else {"max_output_tokens": max_output_tokens}
        await self.send("response.create", response=response)
        samples = 0
        while True:
            event = await self.recv()
            kind = event["type"]
            if kind == "response.output_audio.delta":
                pcm = np.frombuffer(base64.b64decode(event["delta"]), "<i2")
                samples += pcm.size
                yield AudioDelta((pcm / 32768.0).astype(np.float32))
            elif kind in ("response.output_audio_transcript.delta", "response.output_text.delta"):
                yield TextDelta(event["delta"])
            elif kind == "error":
                errors[f"error {event['error'].get('code')}: {event['error'].get('message')}"] += 1
                yield Finished(timings={"audio_s": samples / OUTPUT_RATE, "failed": 1.0})
                return
            elif kind == "response.done":
                done = event["response"]
                if done.get("status") not in ("completed", "incomplete"):
                    errors[f"response {done.get('status')}: {json.dumps(done.get('status_details'))}"] += 1
                usage = done.get("usage") or {}
                cached = (usage.get("input_token_details") or {}).get("cached_tokens", 0)
                yield Finished(input_tokens=usage.get("input_tokens", 0), cached_tokens=cached, timings={
                    "audio_s": samples / OUTPUT_RATE, "reused_tokens": float(cached),
                    "prefill_tokens": float(usage.get("input_tokens", 0) - cached),
                    "failed": float(done.get("status") not in ("completed", "incomplete"))})
                return

    async def close(self) -> None:
        try:
            await asyncio.wait_for(self.ws.close(), 5)
        except (asyncio.TimeoutError, ConnectionError, aiohttp.ClientError):
            pass
        finally:
            await self._http.close()


class WorkerEngine:
    """The callers' engine: a worker at `url` (ws://HOST:PORT/v1/realtime)."""

    name = "worker"

    def __init__(self, url: str, api_key: str | None = None) -> None:
        self.url = url
        self.api_key = api_key
        self.errors: collections.Counter[str] = collections.Counter()
        self._calls: dict[str, WorkerCall] = {}      # the bench's session id → its call
        self._prepared: dict[str, WorkerCall | None] = {}  # request id → its call (None: its input failed)
        self._closing: set[asyncio.Task] = set()

    async def send_input(self, request: GenerationRequest) -> None:
        call = self._calls.get(request.session_id) if request.session_id else None
        try:
            if call is None:
                call = await WorkerCall.open(self.url, request.instructions, self.api_key)
                if request.session_id:
                    self._calls[request.session_id] = call
            await call.send_turn(new_items(request.context))
        except (ConnectionError, RuntimeError, aiohttp.ClientError, asyncio.TimeoutError) as error:
            self.errors[f"turn not taken: {error.__class__.__name__}: {error}"] += 1
            self._prepared[request.request_id] = None
            REPLY_SECONDS.pop(request.request_id, None)
            if call is not None:
                self._calls.pop(request.session_id, None)
                await call.close()
            return
        if request.request_id in REPLY_SECONDS:  # this reply's length, for the worker's request
            REPLY_SECONDS[call.session_id] = REPLY_SECONDS.pop(request.request_id)
        self._prepared[request.request_id] = call

    async def generate(self, request: GenerationRequest) -> AsyncIterator:
        if request.request_id not in self._prepared:
            await self.send_input(request)
        call = self._prepared.pop(request.request_id)
        if call is None:  # its input was not taken: a reply without audio
            yield Finished(timings={"audio_s": 0.0, "failed": 1.0})
            return
        finished = False
        try:
            try:
                async for delta in call.respond(request.max_output_tokens, self.errors):
                    yield delta
            except (ConnectionError, aiohttp.ClientError, asyncio.TimeoutError) as error:
                self.errors[f"reply broken off: {error.__class__.__name__}: {error}"] += 1
                yield Finished(timings={"audio_s": 0.0, "failed": 1.0})
                return
            finished = True
        finally:
            if request.session_id is None or not finished:
                # a call of one turn is over; a turn cut short (cancelled) ends its call: the
                # worker cancels the reply when its socket closes
                if request.session_id is not None:
                    self._calls.pop(request.session_id, None)
                REPLY_SECONDS.pop(call.session_id, None)
                await call.close()

    def end_session(self, session_id: str) -> None:
        call = self._calls.pop(session_id, None)
        if call is not None:
            task = asyncio.get_running_loop().create_task(call.close())
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def close(self) -> None:
        """Every call still open ends."""
        calls, self._calls = list(self._calls.values()), {}
        await asyncio.gather(*(call.close() for call in calls), *self._closing, return_exceptions=True)
