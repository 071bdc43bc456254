"""Turn a growing list of token ids into text pieces, never splitting a UTF-8 character."""

from __future__ import annotations


class IncrementalDecoder:
    """Decodes only a short window of recent tokens per step (not the whole reply).

    A byte-level BPE token can hold part of a multi-byte character (an emoji is often two or
    three tokens). The tokenizer decodes an incomplete sequence at the end as U+FFFD, so while
    the decoded window ends in U+FFFD its piece is held back until the character completes;
    a character still incomplete when the reply ends (cut by the token limit or a cancel) is
    dropped rather than sent as U+FFFD. Bytes that can never form a character (a lead byte
    followed by no continuation: only a broken or random model, e.g. tiny-random, produces
    them) are dropped too, so a transcript never shows U+FFFD.
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
            return text[len(prefix):].replace("\ufffd", "")
        return ""

    def flush(self) -> str:
        """What is still held back, less a character that never completed."""
        prefix = self._decode(self.ids[self.prefix_offset:self.read_offset])
        text = self._decode(self.ids[self.prefix_offset:])
        self.prefix_offset = self.read_offset = len(self.ids)
        return text[len(prefix):].replace("\ufffd", "")

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True,
                                     clean_up_tokenization_spaces=False)
