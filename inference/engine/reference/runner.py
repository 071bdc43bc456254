"""The model runner: executes on the device what the scheduler decided, nothing more.

It owns the device memory: the thinker's and talker's KV pools (one slot per reply that may
run at once), the talker's per-slot code history (for the repetition penalty), the audio
encoder's output cache, and the CUDA graphs. Its operations:

- `prefill(...)`: one chunk of one reply's prompt into its slot (thinker, and the talker's
  prompt part in lockstep: the talker reads the thinker's states of the same tokens), from
  graphs per (chunk-length bucket, attention window), the chunk padded to its bucket;
- `thinker_step(...)`: one decode step for a batch of replies (each feeds one token);
- `talker_start(...)` / `talker_step(...)`: the talker's prefill tail for one reply, and one
  decode step for a batch, each sampling the next code on the device;
- token2wav (`self.token2wav`): DiT windows and vocoder chunks of many replies at once.

Decode steps run from CUDA graphs captured per (batch-size bucket, attention window) at
start-up; on the CPU the same code runs eagerly. A step's outputs are copied out before the
next step, since every graph's outputs are overwritten by its next replay.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

import torch

from .audio_encoder import ChunkedAudioEncoder, encode_audio
from .compiled import compile_step, talker_layer, thinker_layer
from .cuda_graphs import batch_buckets, bucket_for, capture_each, own_stream
from .int8_matmul import add_copy, product, quantize_layers
from .joined_layers import join_projections
from .host_copy import copy_from_host, to_device
from .kv_pool import BatchView, KVPool, forward
from .prompt import Clip, Prompt, audio_features
from .sampling import NoiseBank, SamplingParams, TokenSampler
from .talker import suppressed_codes
from .token2wav_runner import PendingWaves, Token2WavRunner
from .token2wav_stream import ChunkPlan

logger = logging.getLogger(__name__)

# talker steps whose sampling noise a slot draws at once (NoiseBank): a batch of 32 then draws
# twice a step on average instead of 32 times
NOISE_STEPS = 16


class DeviceRunner:
    """What every family's runner shares with the loop: its streams and graph memory, the wait
    for the device, and the one read a step makes. Subclasses call `_init_device` first.

    The loop's work (prompt chunks, the decode steps, the talkers' starts) goes on a stream of
    its own at a high priority (token2wav's is lower). With `talker_stream` the talker's
    decode step goes first in a loop step (`talker_beside_thinker`) and, on CUDA, on a second
    stream, beside the thinker's. Each step reads its weights once and neither reaches the
    GPU's bandwidth (at Qwen2.5-Omni-7B's shapes the thinker's ~14 GB at 3.3 TB/s, the
    talker's ~2.7 GB at ~1.5 TB/s: latency-bound, one small kernel after another), so side
    by side they take less than one after the other: 4.3 ms against 5.2 at one row on an H200
    (2026-12-04, with the thinker's int8 weights). The talker's
    step then reads only what earlier steps made (a reply-stream element is a step old when
    its talker reads it), so the two are independent within a step; the talker runs a step
    behind the thinker, so its first code comes one thinker step later."""

    def _init_device(self, device: torch.device, cuda_graphs: bool, talker_stream: bool) -> None:
        self.device = device
        cuda = device.type == "cuda"
        # every stream is the runner's own (cuda_graphs.own_stream says why)
        self.stream = own_stream(device, priority=-1) if cuda else None
        self.talker_beside_thinker = talker_stream
        self.talker_stream = own_stream(device, priority=-1) if cuda and talker_stream else None
        graphs = cuda_graphs and cuda
        self.graph_pool = torch.cuda.graph_pool_handle() if graphs else None
        # the loop's graphs (prompt chunks, the thinker's decode step, the audio encoder) are
        # captured here; they replay one at a time, on `stream`
        self.capture_stream = own_stream(device) if graphs else None
        # the talker's decode graphs may replay at the same time as the loop's: a memory pool
        # and a capture stream of their own (cuda_graphs.py)
        self.talker_graph_pool = torch.cuda.graph_pool_handle() if graphs else None
        self.talker_capture_stream = own_stream(device) if graphs else None
        self._pinned: torch.Tensor | None = None  # host buffer of `read`

    def loop_stream(self):
        """A context in which the engine loop's work goes on the runner's stream."""
        return torch.cuda.stream(self.stream) if self.stream is not None else contextlib.nullcontext()

    def talker_side(self):
        """A context in which the talker's decode step goes on its own stream (where there is
        one), after the loop's earlier work (the talker starts and thinker states it reads);
        the step's `read` waits for it."""
        if self.talker_stream is None:
            return contextlib.nullcontext()
        self.talker_stream.wait_stream(torch.cuda.current_stream())
        return torch.cuda.stream(self.talker_stream)

    def synchronize(self) -> None:
        """Wait for everything queued on the device (by any thread) to be done."""
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def read(self, *ids: torch.Tensor) -> list[list[int]]:
        """Integer tensors (1-D, on the device) as lists on the host, in one copy: the one
        point of a decode step where the host waits for the device."""
        if not ids:
            return []
        if self.talker_stream is not None:
            torch.cuda.current_stream().wait_stream(self.talker_stream)
        joined = torch.cat([tensor.to(torch.long) for tensor in ids])
        if joined.is_cuda:
            host = self._read_buffer(joined.numel())
            host.copy_(joined, non_blocking=True)
            torch.cuda.current_stream().synchronize()
            values = host.tolist()
        else:
            values = joined.tolist()
        out, start = [], 0
        for tensor in ids:
            out.append(values[start:start + tensor.numel()])
            start += tensor.numel()
        return out

    def _read_buffer(self, size: int) -> torch.Tensor:
        if self._pinned is None or self._pinned.numel() < size:
            self._pinned = torch.empty(max(size, 256), dtype=torch.long, pin_memory=True)
        return self._pinned[:size]


class ModelRunner(DeviceRunner):
    codes_per_frame = 1  # Qwen2.5-Omni's talker makes one code a step

    @torch.inference_mode()  # the pools and graph buffers are only ever used in inference mode
    def __init__(self, model, feature_extractor, *, slots: int, thinker_capacity: int,
                 talker_capacity: int, talker_sampling: SamplingParams, chunk_plan: ChunkPlan,
                 device: torch.device, cuda_graphs: bool, encoder_cache_bytes: int,
                 prefill_chunk_tokens: int, talker_stream: bool = False, int8_weights: bool = False,
                 token2wav_dtype: torch.dtype = torch.float32,
                 compile: bool = False, other_chunk_plans: tuple[ChunkPlan, ...] = (),
                 fused_vocoder: bool | None = None, settings=None) -> None:
        started = time.monotonic()
        self.model = model
        self.thinker = model.thinker
        self.talker = model.talker
        self._init_device(device, cuda_graphs, talker_stream)
        self.slots = slots
        # q/k/v and gate/up as one product each in every decode step and prompt chunk
        join_projections(self.thinker.model.layers)
        join_projections(self.talker.model.layers)
        if int8_weights:  # the decode steps read int8 copies (int8_matmul.py)
            quantize_layers(self.thinker.model.layers)
            quantize_layers(self.talker.model.layers)
            add_copy(self.thinker.lm_head, "weight", self.thinker.lm_head.weight)
        text_config = self.thinker.config.text_config
        dtype = self.thinker.lm_head.weight.dtype
        self.thinker_pool = KVPool(text_config, slots, thinker_capacity, device, dtype)
        self.talker_pool = KVPool(self.talker.config, slots, talker_capacity, device,
                                  self.talker.codec_head.weight.dtype)
        config = self.talker.config
        self.codec_mask = config.tts_codec_mask_token_id
        self.codec_pad = config.tts_codec_pad_token_id
        self.codec_bos = config.tts_codec_start_token_id
        # codes each slot has produced, by KV position + 1, padded with the codec mask code
        # (which the prompt part always holds, so the penalty sees the same set of codes)
        self.talker_history = torch.full((slots + 1, talker_capacity + 1), self.codec_mask,
                                         dtype=torch.long, device=device)
        codebook = model.token2wav.code2wav_dit_model.config.num_embeds + 1
        self.talker_sampler = TokenSampler(talker_sampling, device,
                                           suppress_ids=suppressed_codes(config, codebook))
        self.is_end = torch.zeros((1, config.vocab_size), dtype=torch.bool, device=device)
        self.is_end[0, [config.tts_codec_pad_token_id, config.tts_codec_end_token_id]] = True
        embed = self.thinker.get_input_embeddings()
        with torch.inference_mode():
            ids = torch.tensor([[config.tts_text_end_token_id, config.tts_text_pad_token_id]], device=device)
            pair = embed(ids)
            self.text_eos, self.text_pad = pair[:, :1].clone(), pair[:, 1:].clone()
            self.pad_bos_codes = torch.tensor([self.codec_pad, self.codec_bos], device=device)
            self.codec_pad_embed = self.talker.get_input_embeddings()(self.pad_bos_codes[None])
            # each voice's speaker bos, as the talker's first prompt element reads it
            self.speaker_bos = {name: embed(torch.tensor([[int(speaker["bos_token"])]], device=device)).clone()
                                for name, speaker in model.speaker_map.items()}
        self.feature_extractor = feature_extractor
        tower = self.thinker.audio_tower
        self.audio_encoder = (ChunkedAudioEncoder(tower, device, dtype, self.capture_stream, self.graph_pool)
                              if ChunkedAudioEncoder.supports(tower) else None)
        self.encoder_cache = AudioEncoderCache(self._encode_clip, encoder_cache_bytes)
        self.buckets = batch_buckets(slots)
        self.thinker_decode = _ThinkerDecode(self, cuda_graphs, compile)
        self.talker_decode = _TalkerDecode(self, cuda_graphs, compile)
        buckets = [size for size in PREFILL_BUCKETS if size < prefill_chunk_tokens] + [prefill_chunk_tokens]
        hidden = text_config.hidden_size
        self.thinker_chunk = _ChunkForward(self, self.thinker.model, self.thinker_pool, hidden,
                                           dtype, buckets, cuda_graphs)
        # the talker's chunks: prompt parts, and its start (speaker bos + first reply element)
        self.talker_chunk = _ChunkForward(self, self.talker.model, self.talker_pool,
                                          self.talker.config.embedding_size,
                                          self.talker.codec_head.weight.dtype, [2] + buckets,
                                          cuda_graphs, project=self.talker.thinker_to_talker_proj)
        self.token2wav = Token2WavRunner(model.token2wav, model.speaker_map, chunk_plan, device,
                                         cuda_graphs, max_batch=slots, dtype=token2wav_dtype,
                                         compile=compile, other_plans=other_chunk_plans,
                                         fused_vocoder=fused_vocoder)
        logger.info("model runner: %d KV slots (thinker %d tokens, talker %d), batch buckets %s, "
                    "CUDA graphs %s, compiled %s, in %.1f s", slots, thinker_capacity,
                    talker_capacity, self.buckets, "on" if cuda_graphs else "off",
                    "yes" if compile else "no", time.monotonic() - started)

    # ----------------------------------------------------------------- what the loop calls

    def prefill(self, reply, start: int, end: int) -> torch.Tensor | None:
        """Prompt tokens [start, end) of `reply` into its slot (a spoken reply's talker reads
        the same tokens); returns the logits after the last prompt token when `end` is the
        prompt's end, else None."""
        prepared = reply.prepared
        return self._prefill(reply.slot, reply.prompt, start, end, prepared.thinker_positions,
                             prepared.talker_positions if reply.talker is not None else None)

    def thinker_step(self, replies) -> ThinkerStep:
        """One decode step for `replies` (each feeds its pending token); the results stay on
        the device (`read` brings the greedy choices to the host with the step's other ids)."""
        return self.thinker_decode(
            [r.slot for r in replies], [r.pending_token for r in replies],
            [r.prompt.length + len(r.fed) for r in replies],
            [r.prepared.thinker_rope_delta for r in replies])

    def talker_start(self, reply) -> torch.Tensor:
        """The talker's prefill tail for one reply: the speaker's bos and the first reply
        element (with the codec pad and bos embeddings added) at KV positions length,
        length + 1; returns its first frame (1, 1) on the device."""
        talker = reply.talker
        first = self._talker_input(reply)
        length = reply.prompt.length
        talker.length = length + 2
        positions = reply.prepared.talker_positions[:, :, length:length + 2]
        inputs = torch.cat([self.speaker_bos[reply.voice], first], dim=1) + self.codec_pad_embed
        history = self.talker_history[reply.slot]
        history.fill_(self.codec_mask)
        history[length:length + 2].copy_(self.pad_bos_codes)
        hidden = self.talker_chunk(reply.slot, inputs, positions, length)
        logits = self.talker.codec_head(hidden[:, -1])
        noise = torch.ones_like(logits, dtype=torch.float32)
        if self.talker_sampler.params.do_sample:
            self.talker_sampler.draw_noise(noise, reply.generator)
        self.talker_decode.noise.restart(reply.slot)  # the slot's steps draw afresh
        mask_end = to_device([[talker.codes < talker.min_codes]], self.device, torch.bool)
        return self.sample_codes(logits, to_device([reply.slot], self.device),
                                 to_device([length + 1], self.device), mask_end, noise)

    def talker_step(self, replies) -> torch.Tensor:
        """One talker step per reply: the codec embedding of its last code + its next reply
        element, written at KV position `talker.length`; returns each reply's next frame,
        (B, 1) on the device."""
        inputs = [self._talker_input(r) for r in replies]
        codes = self.talker_decode(
            [r.slot for r in replies], [r.talker.last_frame[0] for r in replies], inputs,
            [r.talker.length for r in replies], [r.prepared.talker_rope_delta for r in replies],
            [r.talker.codes < r.talker.min_codes for r in replies], [r.generator for r in replies])
        return codes[:, None]

    def launch_audio(self, replies) -> PendingWaves:
        """The replies' next chunks as one batch (DiT windows, then vocoder chunks) on
        token2wav's stream; the audio comes to the host later (`PendingWaves`)."""
        with self.token2wav.side_stream():
            windows = [r.audio.next_window(final=not r.audio.ready(), batch=len(replies))
                       for r in replies]
            mels = self.token2wav.sample(windows)
            return self.token2wav.vocode([r.audio.vocoder_input(mel) for r, mel in zip(replies, mels)])

    def _talker_input(self, reply) -> torch.Tensor:
        """The reply-stream element the talker's next step reads (1, 1, H): a fed token's
        state, the text-eos embedding once the spoken text is over, then text-pad."""
        element = reply.talker.next_element()
        if element is None:
            return self.text_pad
        return self.text_eos if element.state is None else element.state

    # ----------------------------------------------------------------- internals

    def _encode_clip(self, clip: Clip) -> torch.Tensor:
        """(audio tokens, H) of one clip: its chunks batched (audio_encoder.py), or where that
        does not apply, transformers' encoder."""
        features, mask = audio_features(self.feature_extractor, [clip.samples])
        if self.audio_encoder is not None:
            return self.audio_encoder(features[0], clip.frames)
        dtype = self.thinker.lm_head.weight.dtype
        return encode_audio(self.thinker.audio_tower, features, mask, self.device, dtype)

    def _prefill(self, slot: int, prompt: Prompt, start: int, end: int,
                 thinker_positions: torch.Tensor,
                 talker_positions: torch.Tensor | None) -> torch.Tensor | None:
        ids = prompt.input_ids[:, start:end]
        embeds = self.thinker.get_input_embeddings()(to_device(ids, self.device))
        talker_embeds = embeds
        audio_id = self.thinker.config.audio_token_id
        where = (ids[0] == audio_id).nonzero().squeeze(1)
        if where.numel():
            first_row = int((prompt.input_ids[0, :start] == audio_id).sum())
            rows = self.encoder_cache.rows(prompt.clips, first_row, where.numel()).to(embeds.dtype)
            where = to_device(where, self.device)
            # = masked_scatter / masked_fill over the audio positions, without their host sync;
            # the talker sees zero embeddings there, as generate() hands them to it
            talker_embeds = embeds.index_fill(1, where, 0.0)
            embeds = embeds.index_copy(1, where, rows[None])
        hidden = self.thinker_chunk(slot, embeds, thinker_positions[:, :, start:end], start)
        logits = self.thinker.lm_head(hidden[:, -1]) if end == prompt.length else None
        if talker_positions is not None:
            self.talker_chunk(slot, hidden + talker_embeds, talker_positions[:, :, start:end], start)
        return logits

    def sample_codes(self, logits: torch.Tensor, rows: torch.Tensor, last_positions: torch.Tensor,
                     mask_end: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
        """(B, 1) codes from talker logits (B, vocab) with each row's history, end codes masked
        where `mask_end` (B, 1); records them in the history (no host synchronisation)."""
        masked = torch.where(mask_end & self.is_end, float("-inf"), logits)
        history = self.talker_history.index_select(0, rows) if self.talker_sampler.needs_history else None
        code = self.talker_sampler.sample_on_device(masked, history, noise)
        self.talker_history.index_put_((rows, last_positions + 1), code[:, 0])
        return code

    def release(self) -> None:
        self.thinker_pool = self.talker_pool = self.talker_history = None
        self.thinker_decode = self.talker_decode = self.token2wav = None
        self.thinker_chunk = self.talker_chunk = None
        self.encoder_cache.clear()


PREFILL_BUCKETS = (64, 128, 256, 512, 1024)


class _ChunkForward:
    """One row's forward of up to a few hundred new tokens through a text model into its KV
    slot (prefill chunks; the talker's start): static buffers per length bucket and a graph per
    (bucket, attention window). A shorter input is padded after its real tokens: causal
    attention keeps the padding out of them, and the KV positions the padding fills lie past
    the row's content, where the next chunk or decode step writes before any query reads."""

    def __init__(self, runner: ModelRunner, text_model, pool: KVPool, width: int,
                 dtype: torch.dtype, buckets: list[int], cuda_graphs: bool, project=None,
                 keep_layer: int | None = None) -> None:
        self.text_model = text_model
        self.pool = pool
        self.project = project
        self.keep_layer = keep_layer  # also return the states after this many layers
        device = runner.device
        self.buckets = sorted(set(buckets))
        self.inputs = {size: (torch.zeros((1, size, width), dtype=dtype, device=device),
                              torch.zeros((3, 1, size), dtype=torch.long, device=device),
                              BatchView(pool, 1, size)) for size in self.buckets}
        self.graphs = capture_each(self._run, [(size, window) for size in self.buckets
                                               for window in pool.windows if window >= size],
                                   runner.capture_stream, runner.graph_pool,
                                   "prompt chunks") if cuda_graphs else {}

    def __call__(self, slot: int, inputs: torch.Tensor, positions: torch.Tensor,
                 start: int) -> torch.Tensor:
        """Final hidden states (1, n, H) of `inputs` (1, n, width) written into `slot` from KV
        position `start`, at rope `positions` (3, 1, n), and with `keep_layer` the states after
        that many layers too; valid until the next call."""
        length = inputs.shape[1]
        bucket = next((size for size in self.buckets if size >= length), None)
        if bucket is not None and start + bucket <= self.pool.capacity:
            graph = self.graphs.get((bucket, self.pool.window_for(start + bucket)))
            if graph is not None:
                buffer, rope, view = self.inputs[bucket]
                buffer[:, :length].copy_(inputs)
                rope[:, :, :length].copy_(positions, non_blocking=True)
                view.point([slot], [start])
                out = graph.replay()
                if self.keep_layer is not None:
                    return out[0][:, :length], out[1][:, :length]
                return out[:, :length]
        view = BatchView(self.pool, 1, length)  # eagerly, at the exact length
        view.point([slot], [start])
        view.window = self.pool.window_for(start + length)
        projected = self.project(inputs) if self.project is not None else inputs
        return forward(self.text_model, view, projected, positions.to(inputs.device),
                       keep_layer=self.keep_layer)

    def _run(self, bucket: int, window: int) -> torch.Tensor:
        buffer, rope, view = self.inputs[bucket]
        view.window = window
        projected = self.project(buffer) if self.project is not None else buffer
        return forward(self.text_model, view, projected, rope, keep_layer=self.keep_layer)


class _ThinkerDecode:
    """The thinker's batched decode step: static inputs per batch bucket, a graph per bucket.
    Attention reads each row up to its own length (attention.py), so one graph serves every
    context length."""

    def __init__(self, runner: ModelRunner, cuda_graphs: bool, compile: bool) -> None:
        self.runner = runner
        pool = runner.thinker_pool
        device = runner.device
        self.inputs = {}
        for batch in runner.buckets:
            self.inputs[batch] = (torch.zeros((batch, 1), dtype=torch.long, device=device),
                                  torch.zeros((3, batch, 1), dtype=torch.long, device=device),
                                  BatchView(pool, batch, 1))
        self.layer_step = compile_step(thinker_layer, compile)
        self.graphs = capture_each(self._run, [(batch,) for batch in runner.buckets],
                                   runner.capture_stream, runner.graph_pool,
                                   "thinker decode") if cuda_graphs else {}

    def __call__(self, slots, tokens, lengths, rope_deltas) -> ThinkerStep:
        count = len(slots)
        batch = bucket_for(count, self.runner.buckets)
        token_buffer, positions, view = self.inputs[batch]
        pad = batch - count
        copy_from_host(token_buffer, tokens + [0] * pad)
        copy_from_host(positions, rope_positions(lengths, rope_deltas, pad))
        view.point(list(slots), list(lengths))
        graph = self.graphs.get((batch,))
        state, logits, argmax = graph.replay() if graph is not None else self._run(batch)
        return ThinkerStep(state[:count].clone(), logits[:count], argmax[:count])

    def _run(self, batch: int):
        tokens, positions, view = self.inputs[batch]
        thinker = self.runner.thinker
        embeds = thinker.get_input_embeddings()(tokens)
        hidden = forward(thinker.model, view, embeds, positions, self.layer_step)
        head = thinker.lm_head
        logits = product(hidden[:, -1], head, "weight", head.weight, head.bias)
        # what the talker reads of each fed token: its final hidden state + its embedding
        return hidden + embeds, logits, logits.argmax(dim=-1)


def rope_positions(lengths: list[int], rope_deltas: list[int], pad: int) -> list[int]:
    """A decode step's (3, B, 1) rope positions, flat: per row its KV length + its prompt's rope
    delta, then `pad` zeros, once for each of the three rope sections (the same for generated
    tokens)."""
    return ([length + delta for length, delta in zip(lengths, rope_deltas)] + [0] * pad) * 3


@dataclass
class ThinkerStep:
    """One thinker decode step's results, on the device, row i for the i-th reply."""
    state: torch.Tensor   # (B, 1, H) hidden state + embedding of each fed token (a copy)
    logits: torch.Tensor  # (B, vocab) valid until the next thinker step
    argmax: torch.Tensor  # (B,) the greedy choice, valid until the next thinker step


class _TalkerDecode:
    """The talker's batched decode step, sampling inside: static inputs per batch bucket, a
    graph per bucket."""

    def __init__(self, runner: ModelRunner, cuda_graphs: bool, compile: bool) -> None:
        self.runner = runner
        pool = runner.talker_pool
        device = runner.device
        talker = runner.talker
        width = talker.config.embedding_size
        vocab = talker.config.vocab_size
        dtype = talker.codec_head.weight.dtype
        self.inputs = {}
        for batch in runner.buckets:
            self.inputs[batch] = _TalkerInputs(
                codes=torch.zeros((batch, 1), dtype=torch.long, device=device),
                reply=torch.zeros((batch, 1, width), dtype=dtype, device=device),
                positions=torch.zeros((3, batch, 1), dtype=torch.long, device=device),
                view=BatchView(pool, batch, 1),
                noise=torch.ones((batch, vocab), dtype=torch.float32, device=device),
                mask_end=torch.zeros((batch, 1), dtype=torch.bool, device=device))
        self.noise = NoiseBank(runner.talker_sampler, runner.slots, NOISE_STEPS, vocab, device)
        self.layer_step = compile_step(talker_layer, compile)
        self.graphs = capture_each(self._run, [(batch,) for batch in runner.buckets],
                                   runner.talker_capture_stream, runner.talker_graph_pool,
                                   "talker decode") if cuda_graphs else {}

    def __call__(self, slots, codes, inputs, lengths, rope_deltas, end_masked,
                 generators) -> torch.Tensor:
        count = len(slots)
        batch = bucket_for(count, self.runner.buckets)
        buffers = self.inputs[batch]
        pad = batch - count
        copy_from_host(buffers.codes, codes + [0] * pad)
        torch.cat(inputs, dim=0, out=buffers.reply[:count])
        if buffers.reply.is_cuda:  # made on the loop's stream: not reused before this read
            for element in inputs:
                element.record_stream(torch.cuda.current_stream())
        copy_from_host(buffers.positions, rope_positions(lengths, rope_deltas, pad))
        copy_from_host(buffers.mask_end, end_masked + [False] * pad)
        if self.runner.talker_sampler.params.do_sample:
            self.noise.take(buffers.noise, list(slots), generators)
        buffers.view.point(list(slots), list(lengths))
        graph = self.graphs.get((batch,))
        code = graph.replay() if graph is not None else self._run(batch)
        return code[:count, 0]

    def _run(self, batch: int) -> torch.Tensor:
        buffers = self.inputs[batch]
        view = buffers.view
        talker = self.runner.talker
        inputs = talker.get_input_embeddings()(buffers.codes) + buffers.reply
        hidden = forward(talker.model, view, talker.thinker_to_talker_proj(inputs),
                         buffers.positions, self.layer_step)
        logits = talker.codec_head(hidden[:, -1])
        # sampling is not compiled: it is a few small kernels in the graph, and inductor
        # (torch 2.11) failed to generate top-p's cumulative sum for a symbolic batch
        return self.runner.sample_codes(logits, view.rows, view.write_pos[:, -1], buffers.mask_end,
                                        buffers.noise)


@dataclass
class _TalkerInputs:
    """A talker step's static inputs for one batch bucket."""
    codes: torch.Tensor      # (B, 1) each row's last code
    reply: torch.Tensor      # (B, 1, width) each row's reply-stream element
    positions: torch.Tensor  # (3, B, 1) rope positions
    view: BatchView
    noise: torch.Tensor      # (B, vocab) the sampling draws
    mask_end: torch.Tensor   # (B, 1) end codes masked (before the minimum length)


class AudioEncoderCache:
    """Audio-encoder outputs by clip content hash, on the device, so a clip is encoded once
    however many turns its conversation goes on. A clip a session's prompts stop reading (it
    left the context, or was deleted) goes at once, unless another session reads it, and a
    session's clips go when it ends: a long call keeps only the clips its model still reads.
    Clips of no session (a transcription's, before its reply reads them) stay until the least
    recently used are dropped past `max_bytes`."""

    def __init__(self, encode: Callable[[Clip], torch.Tensor], max_bytes: int) -> None:
        self.encode_clip = encode  # clip → (audio tokens, H) on the device
        self.max_bytes = max_bytes
        self.entries: OrderedDict[int, torch.Tensor] = OrderedDict()
        self.bytes = 0
        self.readers: dict[str, set[int]] = {}  # session -> the clips its latest prompt reads
        self.encoded = 0  # clips run through the encoder (for tests and metrics)

    def rows(self, clips: list[Clip], first: int, count: int) -> torch.Tensor:
        """(count, H): the encoder output rows [first, first + count) of the clips' outputs
        laid end to end (the prompt's audio tokens in order)."""
        pieces, offset = [], 0
        for clip in clips:
            begin, end = max(first, offset), min(first + count, offset + clip.tokens)
            if begin < end:
                pieces.append(self.encode(clip)[begin - offset:end - offset])
            offset += clip.tokens
        return torch.cat(pieces, dim=0)

    def encode(self, clip: Clip) -> torch.Tensor:
        out = self.entries.get(clip.key)
        if out is not None:
            self.entries.move_to_end(clip.key)
            return out
        out = self.encode_clip(clip)
        if out.shape[0] != clip.tokens:
            raise ValueError(f"the audio encoder gave {out.shape[0]} rows for a clip of "
                             f"{clip.tokens} audio tokens")
        self.encoded += 1
        self.entries[clip.key] = out
        self.bytes += out.numel() * out.element_size()
        while self.bytes > self.max_bytes and len(self.entries) > 1:
            _, dropped = self.entries.popitem(last=False)
            self.bytes -= dropped.numel() * dropped.element_size()
        return out

    def read_by(self, session_id: str | None, keys: set[int]) -> None:
        """`session_id`'s newest prompt reads these clips: those its earlier prompt read and
        this one does not are dropped, unless another session still reads them."""
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
