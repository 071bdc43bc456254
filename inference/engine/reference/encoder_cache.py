"""`EncoderCache`: audio- and vision-encoder outputs kept on the device by content hash."""

from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Union

import torch

from .prompt import Clip, Picture, Video

Media = Union[Clip, Picture, Video]


class EncoderCache:
    """Encoder outputs by clip (picture) content hash, on the device, so a clip or picture is
    encoded once however many turns its conversation goes on. One a session's prompts stop
    reading (it left the context, or was deleted) goes at once, unless another session reads
    it, and a session's go when it ends: a long call keeps only what its model still reads.
    Those of no session (a transcription's clip, before its reply reads it) stay until the
    least recently used are dropped past `max_bytes`. Clips and pictures share the budget;
    their hashes are their keys (`Prompt.media_keys`)."""

    def __init__(self, encode: Callable[[Media], torch.Tensor], max_bytes: int) -> None:
        self.encode_clip = encode  # clip or picture → (its tokens, H) on the device
        self.max_bytes = max_bytes
        self.entries: OrderedDict[int, torch.Tensor] = OrderedDict()
        self.bytes = 0
        self.readers: dict[str, set[int]] = {}  # session -> what its latest prompt reads
        self.encoded = 0  # clips and pictures run through an encoder (for tests and metrics)

    def rows(self, clips: list[Media], first: int, count: int) -> torch.Tensor:
        """(count, H): the encoder output rows [first, first + count) of the clips' (pictures')
        outputs laid end to end (the prompt's audio, or image, tokens in order)."""
        pieces, offset = [], 0
        for clip in clips:
            begin, end = max(first, offset), min(first + count, offset + clip.tokens)
            if begin < end:
                pieces.append(self.encode(clip)[begin - offset:end - offset])
            offset += clip.tokens
        return torch.cat(pieces, dim=0)

    def encode(self, clip: Media) -> torch.Tensor:
        out = self.entries.get(clip.key)
        if out is not None:
            self.entries.move_to_end(clip.key)
            return out
        out = self.encode_clip(clip)
        if out.shape[0] != clip.tokens:
            raise ValueError(f"the encoder gave {out.shape[0]} rows for a {type(clip).__name__.lower()} "
                             f"of {clip.tokens} tokens")
        self.encoded += 1
        self.entries[clip.key] = out
        self.bytes += out.numel() * out.element_size()
        while self.bytes > self.max_bytes and len(self.entries) > 1:
            _, dropped = self.entries.popitem(last=False)
            self.bytes -= dropped.numel() * dropped.element_size()
        return out

    def read_by(self, session_id: str | None, keys: set[int]) -> None:
        """`session_id`'s newest prompt reads these clips and pictures: those its earlier prompt
        read and this one does not are dropped, unless another session still reads them."""
        if session_id is None:
            return
        no_longer = self.readers.get(session_id, set()) - keys
        self.readers[session_id] = keys
        self._drop_unread(no_longer)

    def end_session(self, session_id: str) -> None:
        self._drop_unread(self.readers.pop(session_id, set()))

    def _drop_unread(self, keys: set[int]) -> None:
        if not keys:
            return
        for key in keys.difference(*self.readers.values()):
            dropped = self.entries.pop(key, None)
            if dropped is not None:
                self.bytes -= dropped.numel() * dropped.element_size()

    def clear(self) -> None:
        self.entries.clear()
        self.readers.clear()
        self.bytes = 0
