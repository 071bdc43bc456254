"""Which part of the conversation a new connection replays to the worker.

The plugin's copy of the conversation can be longer than what a worker holds or reads: in a
long call the worker's truncation has taken the oldest items out of the model's context
(`response.done`'s `context_start_item_id`, our extension, says where the model's reading
starts), and the worker holds at most so many items and so much user audio. Replaying all of
it would only be refused item by item at the worker's limits, the newest first. So a
reconnection replays the newest items the worker can hold, from where the lost worker's model
was reading, and the session forgets the rest on the worker's side (the agent's own chat
context keeps the whole call for transcripts).
"""

from __future__ import annotations

from collections.abc import Sequence

from livekit.agents import llm

# The worker's defaults (OMNI_LIMIT_MAX_CONVERSATION_ITEMS, OMNI_LIMIT_MAX_CONVERSATION_AUDIO_S).
WORKER_MAX_ITEMS = 1000
WORKER_MAX_AUDIO_S = 1800.0


def replay_plan(items: Sequence[llm.ChatItem], context_start: str | None, *,
                max_items: int = WORKER_MAX_ITEMS,
                max_audio_s: float = WORKER_MAX_AUDIO_S) -> tuple[list[llm.ChatItem], list[str]]:
    """The items to replay (oldest first) and the ids of those left out.

    Kept: from `context_start` on (all when it is None or not in `items`), the newest that fit
    `max_items` and `max_audio_s` of user audio, never a function call's output without its
    call."""
    ids = [item.id for item in items]
    start = ids.index(context_start) if context_start in ids else 0
    kept: list[llm.ChatItem] = []
    audio_s = 0.0
    for item in reversed(items[start:]):
        audio_s += _audio_seconds(item)
        if len(kept) + 1 > max_items or audio_s > max_audio_s:
            break
        kept.append(item)
    kept.reverse()
    calls = {item.call_id for item in kept if item.type == "function_call"}
    while kept and kept[0].type == "function_call_output" and kept[0].call_id not in calls:
        kept.pop(0)
    kept_ids = {item.id for item in kept}
    return kept, [item_id for item_id in ids if item_id not in kept_ids]


def _audio_seconds(item: llm.ChatItem) -> float:
    if item.type != "message":
        return 0.0
    return sum(frame.duration for part in item.content if isinstance(part, llm.AudioContent) for frame in part.frame)
