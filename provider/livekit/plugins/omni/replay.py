"""Which part of the conversation a new connection replays to the worker.

The plugin's copy of the conversation can be longer than what a worker holds or reads: in a
long call the worker's truncation has taken the oldest items out of the model's context (the
worker names them in `response.context_truncated`, our extension, the moment it cuts), and
the worker holds at most so many items and so much user audio. Replaying all of it would only
be refused item by item at the worker's limits, the newest first, and would put back in the
new worker's context what the lost one had dropped. So a reconnection replays the items the
lost worker's model was still reading, the newest the worker can hold of them, and the
session forgets the rest on the worker's side (the agent's own chat context keeps the whole
call for transcripts).
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

from livekit.agents import llm

# The worker's defaults (OMNI_LIMIT_MAX_CONVERSATION_ITEMS, OMNI_LIMIT_MAX_CONVERSATION_AUDIO_S).
WORKER_MAX_ITEMS = 1000
WORKER_MAX_AUDIO_S = 1800.0


def replay_plan(items: Sequence[llm.ChatItem], left_context: Collection[str] = (), *,
                max_items: int = WORKER_MAX_ITEMS,
                max_audio_s: float = WORKER_MAX_AUDIO_S) -> tuple[list[llm.ChatItem], list[str]]:
    """The items to replay (oldest first) and the ids of those left out.

    Kept: the items not in `left_context` (those the lost worker's model no longer read), the
    newest of them that fit `max_items` and `max_audio_s` of user audio, and never a function
    call's output whose call is left out, wherever it is (the worker itself never cuts between
    them)."""
    kept: list[llm.ChatItem] = []
    audio_s = 0.0
    for item in reversed([item for item in items if item.id not in left_context]):
        audio_s += _audio_seconds(item)
        if len(kept) + 1 > max_items or audio_s > max_audio_s:
            break
        kept.append(item)
    kept.reverse()
    kept = _without_outputs_of_calls_left_out(items, kept)
    kept_ids = {item.id for item in kept}
    return kept, [item.id for item in items if item.id not in kept_ids]


def _without_outputs_of_calls_left_out(items: Sequence[llm.ChatItem], kept: list[llm.ChatItem]) -> list[llm.ChatItem]:
    """`kept` less each function call output whose call is not kept, wherever it is. An
    output pairs with the latest call of its call_id before it that has no output yet (a
    client may reuse a call_id); one with no such call (the client deleted it) is kept: the
    worker holds it so too."""
    kept_ids = {item.id for item in kept}
    open_calls: dict[str, list[str]] = {}  # call_id -> ids of its calls not answered yet
    dropped = set()
    for item in items:
        if item.type == "function_call":
            open_calls.setdefault(item.call_id, []).append(item.id)
        elif item.type == "function_call_output" and open_calls.get(item.call_id):
            if open_calls[item.call_id].pop() not in kept_ids:
                dropped.add(item.id)
    return [item for item in kept if item.id not in dropped]


def _audio_seconds(item: llm.ChatItem) -> float:
    if item.type != "message":
        return 0.0
    return sum(frame.duration for part in item.content if isinstance(part, llm.AudioContent) for frame in part.frame)
