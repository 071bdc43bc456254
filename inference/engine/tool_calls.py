"""Split a model's streamed text into the spoken transcript and hermes-style tool calls.

Shared by both engines. Qwen2.5-Omni and Qwen3-Omni call tools by writing `<tool_call>\\n{"name": …, "arguments": {…}}\\n</tool_call>`
in their reply. Those blocks are not transcript: the parser holds back any text that might be
the start of one, so a partial `<tool_` never reaches the client. Whitespace is held back too
until more text follows, so the newlines between calls never end up in the transcript.
"""

from __future__ import annotations

import json
import logging
import secrets

from .base import ToolCallDelta

logger = logging.getLogger(__name__)

OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"


def new_call_id() -> str:
    return f"call_{secrets.token_hex(10)}"


def parse_tool_call(body: str) -> ToolCallDelta | None:
    """`{"name": ..., "arguments": ...}` → ToolCallDelta; None (and a warning) if malformed.

    A malformed call is dropped rather than spoken: reading JSON aloud helps nobody.
    """
    try:
        payload = json.loads(body)
    except ValueError:
        logger.warning("dropping a tool call that is not valid JSON: %r", body[:200])
        return None
    name = payload.get("name") if isinstance(payload, dict) else None
    if not isinstance(name, str) or not name:
        logger.warning("dropping a tool call without a name: %r", body[:200])
        return None
    arguments = payload.get("arguments", {})
    if isinstance(arguments, str):  # some models send the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except ValueError:
            pass
    return ToolCallDelta(new_call_id(), name, json.dumps(arguments, ensure_ascii=False))


class ToolCallParser:
    """Feed text pieces; get back transcript text and complete tool calls, in order."""

    def __init__(self) -> None:
        self._pending = ""        # text not yet classified
        self._in_call = False
        self._after_call = False  # strip the whitespace that separates calls from text

    def feed(self, piece: str) -> list[str | ToolCallDelta]:
        self._pending += piece
        out: list[str | ToolCallDelta] = []
        while True:
            if self._in_call:
                end = self._pending.find(CLOSE_TAG)
                if end < 0:
                    return out
                call = parse_tool_call(self._pending[:end].strip())
                if call is not None:
                    out.append(call)
                self._pending = self._pending[end + len(CLOSE_TAG):]
                self._in_call = False
                self._after_call = True
                continue
            start = self._pending.find(OPEN_TAG)
            if start >= 0:
                self._emit_text(self._pending[:start], out, final=True)
                self._pending = self._pending[start + len(OPEN_TAG):]
                self._in_call = True
                continue
            # hold back a possible tag start and the whitespace before it
            tag = _partial_tag_length(self._pending)
            head = self._pending[:len(self._pending) - tag]
            keep = tag + len(head) - len(head.rstrip())
            self._emit_text(self._pending[:len(self._pending) - keep], out, final=False)
            self._pending = self._pending[len(self._pending) - keep:]
            return out

    def finish(self) -> list[str | ToolCallDelta]:
        """End of the reply: an unterminated call is parsed as is; held text is flushed."""
        out: list[str | ToolCallDelta] = []
        if self._in_call:
            call = parse_tool_call(self._pending.strip())
            if call is not None:
                out.append(call)
        else:
            self._emit_text(self._pending, out, final=True)
        self._pending = ""
        self._in_call = False
        return out

    def _emit_text(self, text: str, out: list, final: bool) -> None:
        if final:
            text = text.rstrip()  # whitespace before a call or at the end is not transcript
        if self._after_call:
            text = text.lstrip()
        if text:
            out.append(text)
            self._after_call = False


def _partial_tag_length(text: str) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of OPEN_TAG."""
    for length in range(min(len(OPEN_TAG) - 1, len(text)), 0, -1):
        if OPEN_TAG.startswith(text[-length:]):
            return length
    return 0
