"""Conversation item creates and deletes waiting for the worker's answer."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Literal

from livekit.agents import llm

from . import wire


@dataclass
class ItemOp:
    """A conversation.item.create/delete waiting for the worker's answer."""

    event: wire.Event
    kind: Literal["create", "delete"]
    item_id: str
    chat_item: llm.ChatItem | None = None  # what a create puts into the mirror
    future: asyncio.Future[None] | None = None
    replay: bool = False  # re-creating a mirror item on a new connection
    sent: bool = False

    @property
    def event_id(self) -> str:
        return self.event["event_id"]


class ItemOps:
    """By event id. The worker answers with `conversation.item.added`/`.deleted` naming the
    item (not the event), or with an `error` naming the event."""

    def __init__(self) -> None:
        self._ops: dict[str, ItemOp] = {}

    def add(self, op: ItemOp) -> None:
        self._ops[op.event_id] = op

    def sent(self, event_id: str) -> None:
        if op := self._ops.get(event_id):
            op.sent = True

    def take(self, kind: str, item_id: str) -> ItemOp | None:
        """The oldest op of this kind on this item, which the worker has just answered."""
        for event_id, op in self._ops.items():
            if op.kind == kind and op.item_id == item_id:
                return self._ops.pop(event_id)
        return None

    def take_refused(self, event_id: str | None) -> ItemOp | None:
        return self._ops.pop(event_id, None) if event_id else None

    def unanswered_on_lost_socket(self) -> list[ItemOp]:
        """Ops sent on a socket that closed before answering (not replays): to send again.
        Replays of a lost connection are forgotten: the new one replays everything anew."""
        self._ops = {key: op for key, op in self._ops.items() if not op.replay}
        return [op for op in self._ops.values() if op.sent]

    def reset(self) -> None:
        """The session is closing: every caller still waiting fails, and nothing is pending."""
        for op in self._ops.values():
            if op.future is not None and not op.future.done():
                op.future.set_exception(llm.RealtimeError("the omni realtime session is closed"))
        self._ops.clear()
