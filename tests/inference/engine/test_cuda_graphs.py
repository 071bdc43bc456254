"""The engine's streams: torch's pool hands streams out round robin, so a stream drawn late can
be one drawn early; `own_stream` never hands out one a live owner holds (a shared capture
stream hung an H200's device). Runs on a fake pool: no GPU is needed for the rule. And the
batch buckets graphs are captured for."""

from __future__ import annotations

import itertools

import pytest

from inference.engine.reference.cuda_graphs import (batch_buckets, bucket_for, fine_batch_buckets,
                                                    own_stream)


class FakeStream:
    """What torch.cuda.Stream() returns: a new Python object around one of the pool's streams."""

    def __init__(self, handle: str) -> None:
        self.cuda_stream = handle


def round_robin_pool(size: int):
    handles = [f"fake-stream-{id(object())}-{i}" for i in range(size)]
    counter = itertools.count()
    return lambda device, priority: FakeStream(handles[next(counter) % size])


def test_an_owned_stream_is_never_handed_out_again_while_it_is_held():
    pool = round_robin_pool(4)
    offered: list[str] = []  # every stream the pool handed out, in order

    def draw(device, priority):
        stream = pool(device, priority)
        offered.append(stream.cuda_stream)
        return stream

    loop = own_stream("cuda", draw=draw)
    talker_capture = own_stream("cuda", draw=draw)
    for _ in range(3):  # others draw side streams: the pool comes round to the owned ones
        draw("cuda", 0)
    before = len(offered)
    token2wav = own_stream("cuda", draw=draw)
    token2wav_capture = own_stream("cuda", draw=draw)
    handles = [s.cuda_stream for s in (loop, talker_capture, token2wav, token2wav_capture)]
    assert len(set(handles)) == 4
    # while token2wav's streams were drawn the pool offered the talker's again (the case the
    # rule is for), and own_stream passed over it and drew once more
    assert talker_capture.cuda_stream in offered[before:]
    assert len(offered) - before == 3


def test_a_stream_is_free_again_once_its_owner_drops_it_and_a_full_pool_is_refused():
    draw = round_robin_pool(2)
    first, second = own_stream("cuda", draw=draw), own_stream("cuda", draw=draw)
    with pytest.raises(RuntimeError, match="every CUDA stream"):
        own_stream("cuda", draw=draw)
    dropped = first.cuda_stream
    del first
    again = own_stream("cuda", draw=draw)
    assert again.cuda_stream == dropped != second.cuda_stream


def test_streams_held_only_by_garbage_in_a_reference_cycle_are_freed_when_needed():
    draw = round_robin_pool(1)

    class ClosedRunner:  # a runner that refers to itself, as closed engines' runners may
        def __init__(self) -> None:
            self.stream = own_stream("cuda", draw=draw)
            self.me = self

    runner = ClosedRunner()
    handle = runner.stream.cuda_stream
    del runner  # unreachable, but alive until the cycle collector runs
    assert own_stream("cuda", draw=draw).cuda_stream == handle


@pytest.mark.parametrize("largest", [1, 3, 8, 40, 64, 100])
def test_token2wav_buckets_pad_a_batch_by_at_most_a_third(largest):
    """Token2wav's cost grows with every row, so its buckets are closer than the decode steps'
    powers of two, whose batch of 9 runs as 16 (token2wav's as 10)."""
    fine, coarse = fine_batch_buckets(largest), batch_buckets(largest)
    assert fine == sorted(set(fine)) and fine[-1] == coarse[-1] == largest
    for batch in range(1, largest + 1):
        assert bucket_for(batch, fine) - batch <= batch / 3, batch
    assert bucket_for(largest + 1, fine) is None
    if largest >= 16:
        assert bucket_for(9, coarse) == 16 and bucket_for(9, fine) == 10
