"""The fast path's per-generation state: static KV caches and captured prefills and steps.

A CUDA graph is bound to the addresses of the buffers it was captured with, and capturing
one takes longer than the steps it saves in a short reply, so graphs are made once at
start-up: one `DecodeSlot` (thinker + talker caches, their prefill graphs per prompt-length
bucket and step graphs per attention window) per generation that may run at once. A
generation borrows a slot for its lifetime and gives it back. The talker's step samples on
the device with the engine's talker sampling settings.

A conversation longer than the slot's capacity (or a forced tool call that could grow past
it) runs on the eager path with transformers' DynamicCache instead: same results, slower.
"""

from __future__ import annotations

import logging
import queue
import time

import torch

from .sampling import SamplingParams, TokenSampler
from .talker import TalkerStaticStep, suppressed_codes
from .thinker import ThinkerStaticStep

logger = logging.getLogger(__name__)


class DecodeSlot:
    def __init__(self, model, thinker_capacity: int, talker_capacity: int,
                 talker_sampling: SamplingParams, device: torch.device, cuda_graphs: bool) -> None:
        self.thinker = ThinkerStaticStep(model.thinker, thinker_capacity, device, cuda_graphs)
        codebook_size = model.token2wav.code2wav_dit_model.config.num_embeds + 1
        sampler = TokenSampler(talker_sampling, device,
                               suppress_ids=suppressed_codes(model.talker.config, codebook_size))
        self.talker = TalkerStaticStep(model.talker, talker_capacity,
                                       model.talker.config.embedding_size, device, cuda_graphs,
                                       sampler=sampler)


class DecodeSlots:
    def __init__(self, model, count: int, thinker_capacity: int, max_codes: int,
                 talker_sampling: SamplingParams, device: torch.device, cuda_graphs: bool) -> None:
        self.thinker_capacity = thinker_capacity
        # the talker holds the prompt, the speaker bos, the first reply token and every code
        self.talker_capacity = thinker_capacity + max_codes + 4
        self.cuda_graphs = cuda_graphs
        self._free: queue.SimpleQueue[DecodeSlot] = queue.SimpleQueue()
        started = time.monotonic()
        with torch.inference_mode():
            for _ in range(count):
                self._free.put(DecodeSlot(model, thinker_capacity, self.talker_capacity,
                                          talker_sampling, device, cuda_graphs))
        logger.info("%d decode slots (thinker %d tokens, talker %d, CUDA graphs %s) in %.1f s",
                    count, thinker_capacity, self.talker_capacity,
                    "on" if cuda_graphs else "off", time.monotonic() - started)

    def acquire(self) -> DecodeSlot:
        """A free slot; the engine runs at most as many generations as there are slots."""
        try:
            return self._free.get_nowait()
        except queue.Empty:
            raise RuntimeError("no free decode slot: more generations than slots") from None

    def release(self, slot: DecodeSlot) -> None:
        self._free.put(slot)
