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

    def __init__(self, encode: Callable[[Media], torch.Tensor], max_bytes: int,
                 encode_pictures: Callable[[list[Picture]], list[torch.Tensor]] | None = None) -> None:
        self.encode_clip = encode  # clip or picture → (its tokens, H) on the device
        self.encode_pictures = encode_pictures  # pictures → each one's rows, as one encoder batch
        self.max_bytes = max_bytes
        self.entries: OrderedDict[int, torch.Tensor] = OrderedDict()
        self.bytes = 0
        self.readers: dict[str, set[int]] = {}  # session -> what its latest prompt reads
        self.encoded = 0  # clips and pictures run through an encoder (for tests and metrics)
        self.batches = 0  # vision-encoder runs over several pictures at once (`encode_together`)
        # the most image tokens one batch takes (EngineOptions.picture_batch_tokens; 0: no
        # batches): its activations grow with it, and pictures past it are encoded by a later
        # batch or their own prefill
        self.max_batch_tokens = 8192

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
        self._keep(clip, out)
        return out

    def encode_together(self, pictures: list[Picture]) -> None:
        """The pictures not yet cached, through the vision encoder as one batch, when there are
        several (an engine step's, from all the sessions it prefills): one pass over the
        encoder's weights for all of them instead of one per picture, up to
        `max_batch_tokens`, in order. A failure leaves them uncached, each then encoded on its
        own by its prompt's prefill."""
        new, tokens = [], 0
        for picture in {p.key: p for p in pictures if p.key not in self.entries}.values():
            if tokens + picture.tokens > self.max_batch_tokens:
                break
            new.append(picture)
            tokens += picture.tokens
        if len(new) < 2 or self.encode_pictures is None:
            return
        outs = self.encode_pictures(new)
        self.batches += 1
        for picture, out in zip(new, outs, strict=True):
            self._keep(picture, out)

    def _keep(self, clip: Media, out: torch.Tensor) -> None:
        if out.shape[0] != clip.tokens:
            raise ValueError(f"the encoder gave {out.shape[0]} rows for a {type(clip).__name__.lower()} "
                             f"of {clip.tokens} tokens")
        self.encoded += 1
        self.entries[clip.key] = out
        self.bytes += out.numel() * out.element_size()
        while self.bytes > self.max_bytes and len(self.entries) > 1:
            _, dropped = self.entries.popitem(last=False)
            self.bytes -= dropped.numel() * dropped.element_size()

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
