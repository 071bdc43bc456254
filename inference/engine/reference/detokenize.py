"""Turn a growing list of token ids into text pieces, never splitting a UTF-8 character."""

from __future__ import annotations


class IncrementalDecoder:
    """Decodes only a short window of recent tokens per step (not the whole reply).

    A byte-level BPE token can hold part of a multi-byte character; while the decoded window
    ends in U+FFFD the piece is held back until the character completes.
    """

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.prefix_offset = 0  # window start: context so the join of pieces is correct
        self.read_offset = 0    # tokens up to here have been returned as text

    def push(self, token_id: int) -> str:
        self.ids.append(token_id)
        prefix = self._decode(self.ids[self.prefix_offset:self.read_offset])
        text = self._decode(self.ids[self.prefix_offset:])
        if len(text) > len(prefix) and not text.endswith("\ufffd"):
            self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
            return text[len(prefix):]
        return ""

    def flush(self) -> str:
        """Whatever is still held back (possibly with replacement characters)."""
        prefix = self._decode(self.ids[self.prefix_offset:self.read_offset])
        text = self._decode(self.ids[self.prefix_offset:])
        self.prefix_offset = self.read_offset = len(self.ids)
        return text[len(prefix):]

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True,
                                     clean_up_tokenization_spaces=False)
