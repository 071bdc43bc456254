"""Speculative replies: a reply started at the VAD's end of speech, before the turn is confirmed.

The agent's turn detector decides a moment after the VAD hears silence whether the user has
finished. Waiting for it and only then asking the worker for a reply puts the model's whole
time to first audio after that decision. Instead, at the VAD's end of speech the session
commits the audio and starts the response at once; the worker's audio is held in the
generation's channels (nobody reads them yet) while the detector decides:

- the turn is confirmed (the framework's `commit_audio()` then `generate_reply()`): the held
  generation is handed over, so its audio plays at once. The audio pushed since the
  speculative commit is only the silence the detector listened to, and is dropped;
- the user goes on speaking: the response is cancelled and its items deleted on the worker,
  the speculative user item is deleted too, and its audio is put back at the front of the
  worker's input buffer, so the turn finally committed holds the whole utterance and the
  worker's conversation holds no orphaned item.

Until the hand-over nothing of the speculation reaches the framework: its `remote_item_added`
and transcription events are held, and its items are left out of chat-context diffs.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any, Literal

from livekit.agents import llm

from .generation import Generation

Outcome = Literal["started", "used", "discarded"]


@dataclass
class Speculation:
    create_id: str  # the response.create's event id
    commit_id: str  # the input_audio_buffer.commit's event id
    samples: int  # 16 kHz samples of the user's audio it committed
    started_at: float = field(default_factory=time.time)
    audio: bytes | None = None  # that audio, once the commit is on the socket
    item_id: str | None = None  # the user item, once the worker committed it
    generation: Generation | None = None  # once the worker created the response
    confirmed: bool = False  # the framework committed the turn
    held: list[tuple[str, Any]] = field(default_factory=list)  # events for the framework, in order

    def owns(self, item_id: str) -> bool:
        """Whether the item is the speculation's user turn or part of its reply."""
        return item_id == self.item_id or (
            self.generation is not None and item_id in self.generation.output_item_ids)


@dataclass(frozen=True)
class RewindInput:
    """Outbox marker: put a withdrawn speculation's audio back in front of the worker's input
    buffer. Done by the sender, because only there is it known what the buffer holds."""

    speculation: Speculation


class SpeculativeReplies:
    """The session's speculation in progress and what withdrawn ones left behind."""

    def __init__(self) -> None:
        self.current: Speculation | None = None
        self.withdrawn_commits: set[str] = set()  # commit ids whose item is deleted on arrival
        self.hidden_items: set[str] = set()  # withdrawn items the framework must never see
        # response.creates held until the withdrawn commits' items are deleted, so that no
        # reply is generated with a withdrawn turn in its context
        self.deferred: list[dict[str, Any]] = []
        self.counts: dict[Outcome, int] = {"started": 0, "used": 0, "discarded": 0}
        self.used_creates: set[str] = set()  # create ids of the replies handed over
        self.used_responses: set[str] = set()  # and their response ids, once known

    def count(self, outcome: Outcome) -> dict[str, Any]:
        self.counts[outcome] += 1
        return {"outcome": outcome, **self.counts}

    def private_items(self) -> set[str]:
        """Items on the worker that the framework's chat context does not know about (yet)."""
        items = set(self.hidden_items)
        if (spec := self.current) is not None:
            if spec.item_id:
                items.add(spec.item_id)
            if spec.generation is not None:
                items.update(spec.generation.output_item_ids)
        return items

    def reset(self) -> Speculation | None:
        """The socket is gone: forgets the speculation in progress (returned, for the caller to
        release), the commits still to withdraw (the lost worker's conversation is rebuilt
        from the mirror, where withdrawn items no longer are) and the replies held for them."""
        spec, self.current = self.current, None
        self.withdrawn_commits.clear()
        self.deferred.clear()  # their generate_reply calls fail with the connection
        return spec


def adopted_future(created: llm.GenerationCreatedEvent) -> asyncio.Future[llm.GenerationCreatedEvent]:
    future: asyncio.Future[llm.GenerationCreatedEvent] = asyncio.get_running_loop().create_future()
    future.set_result(created)
    return future
