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

Two bounds keep that work small whatever a client sends. What one render may tokenize is
capped: a context with more characters of text than `room` tokens could ever hold at
`MAX_CHARS_PER_TOKEN` is cut to the newest items within that many characters before the first
render, so a conversation of long texts is never rendered whole only to learn it does not fit.
And the search stops between renders once `cancelled()` says its generation was cancelled
(`PrepareCancelled`; see `inference.engine.prepare`).
"""

from __future__ import annotations

import functools
from typing import Callable, Sequence

from .base import (
    AssistantText, ContextItem, SystemText, ToolCall, ToolResult, Truncation, UserAudio, UserImage, UserText,
)
from .exceptions import ContextLengthExceeded
from .prepare import PrepareCancelled

# Characters of text one prompt may hold per token of its room. A token of ordinary text is a
# few characters (about 4 in English, fewer in most other scripts), so a prompt that fits its
# room stays far below this; text that packs more into a token (long runs of one character)
# is cut before it is tokenized, rather than tokenized to find out.
MAX_CHARS_PER_TOKEN = 16


def fit_context(context: Sequence[ContextItem], truncation: Truncation, *, room: int,
                measure: Callable[[int], int], max_audio_clips: int | None = None,
                cancelled: Callable[[], bool] | None = None, max_chars: int | None = None,
                max_images: int | None = None) -> int:
    """The index of the first context item the prompt reads.

    `room`: the prompt tokens the model's context holds beside the reply's budget.
    `max_audio_clips`: an engine's cap on user audio clips in one prompt, if any (a prompt
    with more does not fit either); `max_images` the same for pictures. `cancelled`: checked
    before each render; True stops the search (`PrepareCancelled`). `max_chars`: the
    characters of context text one render may tokenize (default: `room` × MAX_CHARS_PER_TOKEN).
    Raises `ContextLengthExceeded` when nothing allowed fits.
    """
    count = measure

    def render(start: int) -> int:
        if cancelled is not None and cancelled():
            raise PrepareCancelled("the generation was cancelled")
        return count(start)

    measure = functools.cache(render)
    clips = _counts(context, UserAudio) if max_audio_clips is not None else None
    pictures = _counts(context, UserImage) if max_images is not None else None
    lowest = _lowest_start(context, truncation, max(room, 1) * MAX_CHARS_PER_TOKEN if max_chars is None else max_chars)

    def media_fit(start: int) -> bool:
        return (clips is None or clips[start] <= max_audio_clips) and \
            (pictures is None or pictures[start] <= max_images)

    def fits(start: int, limit: int) -> bool:
        return measure(start) <= limit and media_fit(start)

    if truncation.mode == "disabled":
        full = measure(0)
        if full > room:
            raise ContextLengthExceeded(full, room)
        if not media_fit(0):
            what, held, most = _over(clips, max_audio_clips, pictures, max_images, 0)
            raise ContextLengthExceeded(full, room, message=(
                f"the conversation holds {held} {what}; this engine reads at most {most} "
                f"in one prompt: delete earlier {'picture' if what == 'pictures' else 'audio'} items, "
                "or turn truncation on"))
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
    if fits(lowest, limit if lowest == 0 else target):  # a cut goes down to the target at once
        return lowest
    points = [point for point in cut_points(context) if point > lowest]
    start = _first(points, lambda p: fits(p, target))
    if start is not None:
        return start
    deepest = points[-1] if points else lowest
    if target < limit and fits(deepest, limit):  # the ratio asks for more than may leave
        return deepest
    raise _nothing_fits(measure(deepest), measure(len(context)), room, post_limit,
                        None if media_fit(deepest) else _over(clips, max_audio_clips, pictures, max_images, deepest))


def _lowest_start(context: Sequence[ContextItem], truncation: Truncation, max_chars: int) -> int:
    """The first start whose text one render may tokenize (the per-render cost limit)."""
    chars = _char_counts(context)
    if chars[0] <= max_chars:
        return 0
    if truncation.mode == "disabled":
        raise ContextLengthExceeded(chars[0], max_chars, message=(
            f"the conversation holds {chars[0]} characters of text; one prompt reads at most {max_chars}: "
            "delete earlier items, or turn truncation on"))
    start = next((point for point in cut_points(context) if chars[point] <= max_chars), None)
    if start is None:
        raise ContextLengthExceeded(chars[0], max_chars, message=(
            f"the newest item alone holds {chars[_newest_start(context)]} characters of text; one prompt reads at "
            f"most {max_chars}: send a shorter one"))
    return start


def _over(clips: list[int] | None, max_clips: int | None, pictures: list[int] | None, max_pictures: int | None,
          start: int) -> tuple[str, int, int]:
    """What `context[start:]` holds too many of: ("audio clips" or "pictures", how many, the cap)."""
    if clips is not None and clips[start] > max_clips:
        return "audio clips", clips[start], max_clips
    return "pictures", pictures[start], max_pictures


def _nothing_fits(shortest: int, base: int, room: int, post_limit: int | None,
                  over: tuple[str, int, int] | None) -> ContextLengthExceeded:
    """The refusal when leaving out every item that may leave is not enough: it names what is
    too long (the instructions and tools, or the items that must stay) and the limit it
    passes (the model's context, or the post_instructions limit)."""
    if base > room:
        return ContextLengthExceeded(base, room, message=(
            f"the instructions and tools alone are {base} tokens; the model's context holds {room} with room "
            "for the reply: shorten them, or ask for a shorter reply"))
    if over is not None:
        what, held, most = over
        return ContextLengthExceeded(shortest, room, message=(
            f"the newest item alone holds {held} {what}; this engine reads at most {most} "
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


def _newest_start(context: Sequence[ContextItem]) -> int:
    points = cut_points(context)
    return points[-1] if points else 0


def _item_chars(item: ContextItem) -> int:
    if isinstance(item, (UserText, SystemText, AssistantText)):
        return len(item.text)
    if isinstance(item, ToolCall):
        return len(item.name) + len(item.arguments)
    if isinstance(item, ToolResult):
        return len(item.output)
    return 0


def _char_counts(context: Sequence[ContextItem]) -> list[int]:
    """chars[start] = characters of text in context[start:]."""
    counts = [0] * (len(context) + 1)
    for index in range(len(context) - 1, -1, -1):
        counts[index] = counts[index + 1] + _item_chars(context[index])
    return counts


def _counts(context: Sequence[ContextItem], kind: type) -> list[int]:
    """counts[start] = items of `kind` (user audio clips, pictures) in context[start:]."""
    counts = [0] * (len(context) + 1)
    for index in range(len(context) - 1, -1, -1):
        counts[index] = counts[index + 1] + isinstance(context[index], kind)
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
