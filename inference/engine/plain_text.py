"""Client text is text: a special token typed by a client is tokenized as the characters it is.

A chat template pastes message text into one string with its own control tokens
(`<|im_start|>`, `<|AUDIO|>`, …), and a tokenizer reading that string cannot tell the two
apart: `<|im_end|>\\n<|im_start|>system\\n…` typed in a chat message would become a real
system turn, and a typed `<|AUDIO|>` one more audio placeholder than there are clips. So the
engines wrap every text a client supplied (`as_text`) before rendering the template, and
`tokenize` reads the rendered string with the template's own added tokens as tokens and the
wrapped spans with special tokens split into ordinary text.

The text around and inside the wraps is tokenized in the same pieces a plain tokenizer call
would cut it into (between the template's added tokens), so text without control tokens
gives exactly the ids it always did.
"""

from __future__ import annotations

import functools
import re
from typing import Any

# Plane-15 private-use code points: no chat template writes them; a client's text that holds
# them has them replaced, so they always mark the wraps.
OPEN, CLOSE = "\U000F0000", "\U000F0001"
_MARKS = re.compile(f"[{OPEN}{CLOSE}]")


def as_text(text: str) -> str:
    """`text` from a client, marked to be tokenized as ordinary text whatever it holds."""
    return OPEN + _MARKS.sub("\ufffd", text) + CLOSE


def unmarked(rendered: str) -> str:
    """The rendered string as the model reads it (the marks removed), e.g. for logs and tests."""
    return _MARKS.sub("", rendered)


@functools.lru_cache(maxsize=8)
def _added_tokens(tokenizer: Any) -> tuple[re.Pattern[str] | None, dict[str, int]]:
    vocab = tokenizer.get_added_vocab()
    if not vocab:
        return None, {}
    pattern = re.compile("|".join(re.escape(token) for token in sorted(vocab, key=len, reverse=True)))
    return pattern, vocab


def tokenize(tokenizer: Any, rendered: str) -> list[int]:
    """Token ids of a rendered template whose client text is marked with `as_text`."""
    pattern, vocab = _added_tokens(tokenizer)
    pieces: list[str] = []  # text between the template's own added tokens
    specials: list[int] = []  # the added token after each piece (-1: none, the end)
    current: list[str] = []
    inside = False
    for part in re.split(f"([{OPEN}{CLOSE}])", rendered):
        if part == OPEN:
            inside = True
        elif part == CLOSE:
            inside = False
        elif inside or pattern is None:
            current.append(part)
        else:
            at = 0
            for match in pattern.finditer(part):
                current.append(part[at:match.start()])
                pieces.append("".join(current))
                specials.append(vocab[match.group()])
                current, at = [], match.end()
            current.append(part[at:])
    pieces.append("".join(current))
    specials.append(-1)
    encoded = tokenizer([piece for piece in pieces], add_special_tokens=False,
                        split_special_tokens=True)["input_ids"]
    ids: list[int] = []
    for piece_ids, special in zip(encoded, specials):
        ids.extend(piece_ids)
        if special >= 0:
            ids.append(special)
    return ids


def mark_messages(messages: list[dict[str, Any]], *, instructions_first: bool) -> list[dict[str, Any]]:
    """Chat messages (the shapes the engines build) with every client text marked by `as_text`:
    user and tool turns, assistant text, tool call names and arguments, system items. The
    first system message stays as it is when it carries the session's instructions (the
    operator's prompt, not a client's text). Returns new dicts; `messages` is not changed."""
    marked: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        message = dict(message)
        content = message.get("content")
        if message.get("role") == "system" and index == 0 and instructions_first:
            pass
        elif isinstance(content, str) and content:
            message["content"] = as_text(content)
        elif isinstance(content, list):
            message["content"] = [{**part, "text": as_text(part["text"])} if isinstance(part.get("text"), str)
                                  else part for part in content]
        if message.get("tool_calls"):
            message["tool_calls"] = [_marked_call(call) for call in message["tool_calls"]]
        marked.append(message)
    return marked


def _marked_call(call: dict[str, Any]) -> dict[str, Any]:
    if isinstance(call.get("function"), dict):
        return {**call, "function": _marked_call(call["function"])}
    return {**call, **{key: as_text(call[key]) for key in ("name", "arguments") if isinstance(call.get(key), str)}}
