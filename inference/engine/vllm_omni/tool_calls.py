"""Split a streamed reply into plain text and `<tool_call>` blocks.

Qwen2.5-Omni and Qwen3-Omni write function calls the way Qwen's text models do ("hermes"
style): a JSON object `{"name": ..., "arguments": {...}}` between `<tool_call>` and
`</tool_call>`, inside the ordinary text stream. Text arrives in arbitrary pieces, so a tag
may be split across two deltas; the splitter holds back just enough text to never emit half
of an opening tag as speech.
"""

from __future__ import annotations

import json
import logging
import uuid

from ..base import ToolCallDelta

logger = logging.getLogger(__name__)

OPEN_TAG = "<tool_call>"
CLOSE_TAG = "</tool_call>"


class ToolCallSplitter:
    """Feed text deltas in; get back text pieces (`str`) and complete `ToolCallDelta`s."""

    def __init__(self) -> None:
        self._pending = ""      # text not yet handed out
        self._in_call = False   # inside <tool_call> … </tool_call>
        self.calls_made = 0

    def feed(self, text: str) -> list[str | ToolCallDelta]:
        self._pending += text
        pieces: list[str | ToolCallDelta] = []
        while True:
            if self._in_call:
                end = self._pending.find(CLOSE_TAG)
                if end < 0:
                    return pieces
                pieces.append(self._parse_call(self._pending[:end]))
                self._pending = self._pending[end + len(CLOSE_TAG):]
                self._in_call = False
                continue
            start = self._pending.find(OPEN_TAG)
            if start < 0:
                keep = _partial_tag_length(self._pending, OPEN_TAG)
                self._emit_text(self._pending[:len(self._pending) - keep], pieces)
                self._pending = self._pending[len(self._pending) - keep:]
                return pieces
            self._emit_text(self._pending[:start], pieces)
            self._pending = self._pending[start + len(OPEN_TAG):]
            self._in_call = True

    def finish(self) -> list[str | ToolCallDelta]:
        """The reply ended: hand out whatever is left (an unclosed call is still tried as a call)."""
        rest, self._pending = self._pending, ""
        pieces: list[str | ToolCallDelta] = []
        if self._in_call:
            self._in_call = False
            pieces.append(self._parse_call(rest))
        else:
            self._emit_text(rest, pieces)
        return pieces

    def _emit_text(self, text: str, pieces: list[str | ToolCallDelta]) -> None:
        # Once the model has started calling tools, the newlines it puts between calls are
        # layout, not speech.
        if text and not (self.calls_made and text.isspace()):
            pieces.append(text)

    def _parse_call(self, body: str) -> str | ToolCallDelta:
        try:
            call = json.loads(body)
            name = call["name"]
            arguments = call.get("arguments", {})
            if not isinstance(name, str) or not name:
                raise ValueError("name must be a non-empty string")
        except (ValueError, KeyError, TypeError, AttributeError) as exc:
            # Like vLLM's hermes parser: what cannot be parsed stays text the client can see.
            logger.warning("model wrote a malformed tool call (%s); passing it on as text", exc)
            return f"{OPEN_TAG}{body}{CLOSE_TAG}"
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False)
        self.calls_made += 1
        return ToolCallDelta(call_id=f"call_{uuid.uuid4().hex[:24]}", name=name, arguments=arguments)


def _partial_tag_length(text: str, tag: str) -> int:
    """Length of the longest end of `text` that is a beginning of `tag` (a tag cut in two)."""
    for length in range(min(len(text), len(tag) - 1), 0, -1):
        if text.endswith(tag[:length]):
            return length
    return 0
