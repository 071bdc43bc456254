"""Where a prompt's conversation starts when it does not all fit: one rule for every engine.

An engine knows how many tokens a prompt is; it hands `fit_context` a `measure(start)` that
renders the request with `context[start:]` and counts its tokens, and gets back the `start`
its prompt should use. Only whole conversation items leave, from the oldest (the cut points
are the boundaries between items that keep a function call with its output); the newest item
always stays, and items without an `item_id` (a response's own input) never leave.

`measure` renders and tokenizes a whole prompt, so it is called as few times as possible: not
at all beyond the first when the prompt fits; otherwise a galloping search from the oldest cut,
which finds the usual small cut of "auto" in two or three renders and a deep cut in about
twice log2(items).
"""

from __future__ import annotations

import functools
from typing import Callable, Sequence

from .base import ContextItem, ToolCall, ToolResult, Truncation, UserAudio
from .exceptions import ContextLengthExceeded


def fit_context(context: Sequence[ContextItem], truncation: Truncation, *, room: int,
                measure: Callable[[int], int], max_audio_clips: int | None = None) -> int:
    """The index of the first context item the prompt reads.

    `room`: the prompt tokens the model's context holds beside the reply's budget.
    `max_audio_clips`: an engine's cap on user audio clips in one prompt, if any (a prompt
    with more does not fit either). Raises `ContextLengthExceeded` when nothing allowed fits.
    """
    measure = functools.cache(measure)
    full = measure(0)
    clips = _clip_counts(context) if max_audio_clips is not None else None

    def clips_fit(start: int) -> bool:
        return clips is None or clips[start] <= max_audio_clips

    def fits(start: int, limit: int) -> bool:
        return measure(start) <= limit and clips_fit(start)

    if truncation.mode == "disabled":
        if full > room:
            raise ContextLengthExceeded(full, room)
        if not clips_fit(0):
            raise ContextLengthExceeded(full, room, message=(
                f"the conversation holds {clips[0]} audio clips; this engine reads at most {max_audio_clips} "
                "in one prompt: delete earlier audio items, or turn truncation on"))
        return 0
    post_limit = None  # the post_instructions limit, where it is below what the context allows
    if truncation.mode == "auto":
        limit = target = room
    else:
        base = measure(len(context))  # instructions, tools and the chat template's own tokens
        budget = room - base
        if truncation.post_instructions_tokens is not None and truncation.post_instructions_tokens < budget:
            budget = post_limit = truncation.post_instructions_tokens
        limit = base + budget
        target = base + int(truncation.retention_ratio * budget)
    if fits(0, limit):
        return 0
    points = cut_points(context)
    start = _first(points, lambda p: fits(p, target))
    if start is not None:
        return start
    deepest = points[-1] if points else 0
    if target < limit and fits(deepest, limit):  # the ratio asks for more than may leave
        return deepest
    raise _nothing_fits(measure(deepest), measure(len(context)), room, post_limit,
                        clips[deepest] if clips is not None and not clips_fit(deepest) else None, max_audio_clips)


def _nothing_fits(shortest: int, base: int, room: int, post_limit: int | None, clips: int | None,
                  max_clips: int | None) -> ContextLengthExceeded:
    """The refusal when leaving out every item that may leave is not enough: it names what is
    too long (the instructions and tools, or the items that must stay) and the limit it
    passes (the model's context, or the post_instructions limit)."""
    if base > room:
        return ContextLengthExceeded(base, room, message=(
            f"the instructions and tools alone are {base} tokens; the model's context holds {room} with room "
            "for the reply: shorten them, or ask for a shorter reply"))
    if clips is not None:
        return ContextLengthExceeded(shortest, room, message=(
            f"the newest item alone holds {clips} audio clips; this engine reads at most {max_clips} "
            "in one prompt: send fewer"))
    if post_limit is not None and shortest - base > post_limit:
        return ContextLengthExceeded(shortest, base + post_limit, message=(
            f"the newest item alone is {shortest - base} tokens after the instructions and tools; "
            f"truncation.token_limits.post_instructions allows {post_limit}: send a shorter one or raise "
            "the limit"))
    return ContextLengthExceeded(shortest, room, newest_only=True)


def cut_points(context: Sequence[ContextItem]) -> list[int]:
    """Ascending indices where the prompt may start: after whole items only, never splitting
    an item, a function call from its output, or leaving out the newest item or one without
    an id."""
    ids = [item.item_id for item in context]
    if not ids or ids[0] is None:
        return []
    newest = max(i for i, item_id in enumerate(ids) if item_id is not None)
    while newest > 0 and ids[newest - 1] == ids[newest]:
        newest -= 1  # the newest item's first context item
    # each output pairs with the latest call of its call_id before it that has none yet: a
    # client may reuse a call_id, and pairing by the id alone would pin everything between
    open_calls: dict[str, list[int]] = {}  # call id -> where its unanswered calls are
    paired = []
    for index, item in enumerate(context):
        if isinstance(item, ToolCall):
            open_calls.setdefault(item.call_id, []).append(index)
        elif isinstance(item, ToolResult) and open_calls.get(item.call_id):
            paired.append((open_calls[item.call_id].pop(), index))
    points = []
    for index in range(1, newest + 1):
        if ids[index - 1] is None:
            break  # an item that may not leave: nothing after it may start the prompt either
        if ids[index] == ids[index - 1]:
            continue
        if any(first < index <= last for first, last in paired):
            continue
        points.append(index)
    return points


def _clip_counts(context: Sequence[ContextItem]) -> list[int]:
    """clips[start] = user audio clips in context[start:]."""
    counts = [0] * (len(context) + 1)
    for index in range(len(context) - 1, -1, -1):
        counts[index] = counts[index + 1] + isinstance(context[index], UserAudio)
    return counts


def _first(points: list[int], fits: Callable[[int], bool]) -> int | None:
    """The first point that fits, assuming that leaving out more never makes a prompt longer:
    gallop (1, 2, 4, … points in), then bisect the last stride."""
    below, step, above = -1, 1, None  # indices into points: known not to fit / to fit
    while above is None:
        probe = min(below + step, len(points) - 1)
        if probe <= below:
            return None
        if fits(points[probe]):
            above = probe
        else:
            below, step = probe, step * 2
    while above - below > 1:
        middle = (below + above) // 2
        if fits(points[middle]):
            above = middle
        else:
            below = middle
    return points[above]
