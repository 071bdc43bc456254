"""The reference engine's incremental detokenizer on multi-byte text split across tokens.

The tokenizer here is a byte-level stand-in that decodes the way Hugging Face's byte-level
BPE tokenizers do (bytes → UTF-8, an incomplete or invalid sequence → U+FFFD), so every way
of splitting a character across tokens can be tried; the real tokenizer is exercised in
test_reference_engine.py."""

from __future__ import annotations

import itertools

import pytest

from inference.engine.reference.detokenize import IncrementalDecoder

TEXT = "Grüße aus 東京 👋🏽, café — naïve"


class ByteTokenizer:
    """Each token id stands for a run of bytes."""

    def __init__(self) -> None:
        self.pieces: list[bytes] = []

    def tokens(self, chunks: list[bytes]) -> list[int]:
        ids = []
        for chunk in chunks:
            self.pieces.append(chunk)
            ids.append(len(self.pieces) - 1)
        return ids

    def decode(self, ids: list[int], **_: object) -> str:
        return b"".join(self.pieces[i] for i in ids).decode("utf-8", errors="replace")


def stream(chunks: list[bytes]) -> list[str]:
    tokenizer = ByteTokenizer()
    decoder = IncrementalDecoder(tokenizer)
    return [decoder.push(i) for i in tokenizer.tokens(chunks)] + [decoder.flush()]


@pytest.mark.parametrize("size", [1, 2, 3, 5])
def test_pieces_never_split_a_character(size: int) -> None:
    data = TEXT.encode()
    pieces = stream([data[i:i + size] for i in range(0, len(data), size)])
    assert "".join(pieces) == TEXT
    assert not any("\ufffd" in piece for piece in pieces)


def test_every_split_of_a_four_byte_character() -> None:
    data = "a👋b".encode()  # 1 + 4 + 1 bytes
    for cuts in itertools.chain.from_iterable(itertools.combinations(range(1, len(data)), n) for n in range(1, 6)):
        bounds = [0, *cuts, len(data)]
        pieces = stream([data[a:b] for a, b in zip(bounds, bounds[1:])])
        assert "".join(pieces) == "a👋b" and not any("\ufffd" in p for p in pieces), cuts


def test_a_character_cut_off_at_the_end_is_dropped() -> None:
    data = "fin 👋".encode()
    pieces = stream([data[:4], data[4:6]])  # the reply ends two bytes into the emoji
    assert "".join(pieces) == "fin "


def test_bytes_that_can_never_form_a_character_are_dropped() -> None:
    # a lead byte, then plain ASCII: what a random model (tiny-random) emits now and then
    pieces = stream([b"ain", b"\xe4", b"en ", "東".encode()])
    assert "".join(pieces) == "ainen 東"
