"""The model runner: executes on the device what the scheduler decided, nothing more.

It owns the device memory: the thinker's and talker's KV pools (one slot per reply that may
run at once), the talker's per-slot code history (for the repetition penalty), the audio and
vision encoders' output cache, and the CUDA graphs. Its operations:

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

import logging
import time
from dataclasses import dataclass

import torch

from ...attention import use_pool_attention
from ...compiled import compile_step
from ...cuda_graphs import batch_buckets, bucket_for, capture_each
from ...device_runner import DeviceRunner
from ...encoder_cache import EncoderCache
from ...host_copy import copy_from_host, to_device
from ...int8_matmul import add_copy, quantize_layers
from ...kv_pool import BatchView, KVPool, forward
from ...pending_audio import PendingWaves
from ...prompt import Clip, Picture, Prompt, Video, audio_features
from ...sampling import NOISE_STEPS, NoiseBank, SamplingParams, TokenSampler
from ...text_steps import PREFILL_BUCKETS, ChunkForward, ThinkerDecode, ThinkerStep, rope_positions
from ..base import ProfiledStep
from .audio_encoder import ChunkedAudioEncoder, encode_audio
from .joined_layers import join_projections, joined_decoder_layer, talker_layer, thinker_layer
from .talker import suppressed_codes
from .token2wav_runner import Token2WavRunner
from .token2wav_stream import ChunkPlan
from .vision import encode_pictures, encode_video

logger = logging.getLogger(__name__)

class Qwen2_5Runner(DeviceRunner):
    codes_per_frame = 1  # Qwen2.5-Omni's talker makes one code a step
    talker_start_rows = 2  # the speaker's bos and the first reply element

    @torch.inference_mode()  # the pools and graph buffers are only ever used in inference mode
    def __init__(self, model, feature_extractor, *, slots: int, thinker_capacity: int,
                 talker_capacity: int, talker_sampling: SamplingParams, chunk_plan: ChunkPlan,
                 device: torch.device, cuda_graphs: bool, encoder_cache_bytes: int,
                 prefill_chunk_tokens: int, talker_stream: bool = False, int8_weights: bool = False,
                 token2wav_dtype: torch.dtype = torch.float32,
                 compile: bool = False, other_chunk_plans: tuple[ChunkPlan, ...] = (),
                 fused_vocoder: bool | None = None, image_processor=None, video_processor=None) -> None:
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
        use_pool_attention(text_config, self.talker.config)  # their layers attend through the pools
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
        self.image_processor = image_processor
        self.video_processor = video_processor
        tower = self.thinker.audio_tower
        self.audio_encoder = (ChunkedAudioEncoder(tower, device, dtype, self.capture_stream, self.graph_pool)
                              if ChunkedAudioEncoder.supports(tower) else None)
        self.encoder_cache = EncoderCache(self._encode, encoder_cache_bytes, encode_pictures=self._encode_pictures)
        self.buckets = batch_buckets(slots)
        self.thinker_decode = ThinkerDecode(self, thinker_layer, cuda_graphs, compile)
        self.talker_decode = _TalkerDecode(self, cuda_graphs, compile)
        buckets = [size for size in PREFILL_BUCKETS if size < prefill_chunk_tokens] + [prefill_chunk_tokens]
        hidden = text_config.hidden_size
        self.thinker_chunk = ChunkForward(self, self.thinker.model, self.thinker_pool, hidden,
                                          dtype, buckets, cuda_graphs, layer_step=joined_decoder_layer)
        # the talker's chunks: prompt parts, and its start (speaker bos + first reply element)
        self.talker_chunk = ChunkForward(self, self.talker.model, self.talker_pool,
                                         self.talker.config.embedding_size,
                                         self.talker.codec_head.weight.dtype, [2] + buckets,
                                         cuda_graphs, project=self.talker.thinker_to_talker_proj,
                                         layer_step=joined_decoder_layer)
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
        return self.thinker_decode.step(replies)

    def talker_start(self, reply) -> torch.Tensor:
        """The talker's prefill tail for one reply: the speaker's bos and the first reply
        element (with the codec pad and bos embeddings added) at KV positions length,
        length + 1; returns its first frame (1, 1) on the device."""
        talker = reply.talker
        first = self._talker_input(reply)
        length = reply.prompt.length
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

    def _encode(self, item: Clip | Picture | Video) -> torch.Tensor:
        """(tokens, H) of one clip, picture or video's frames: what the thinker reads at its tokens."""
        if isinstance(item, Video):
            if self.video_processor is None:
                raise ValueError("this runner was built without a video processor: it reads no video")
            return encode_video(self.thinker, self.video_processor, item, self.device)
        if isinstance(item, Picture):
            return self._encode_pictures([item])[0]
        return self._encode_clip(item)

    def _encode_pictures(self, pictures: list[Picture]) -> list[torch.Tensor]:
        """(tokens, H) of each picture, the pictures encoded as one batch."""
        if self.image_processor is None:
            raise ValueError("this runner was built without an image processor: it reads no pictures")
        return encode_pictures(self.thinker, self.image_processor, pictures, self.device)

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
        config = self.thinker.config
        for token_id, media in ((config.audio_token_id, prompt.clips), (config.image_token_id, prompt.pictures),
                                (config.video_token_id, prompt.videos)):
            if not media:
                continue
            where = (ids[0] == token_id).nonzero().squeeze(1)
            if where.numel():
                first_row = int((prompt.input_ids[0, :start] == token_id).sum())
                rows = self.encoder_cache.rows(media, first_row, where.numel()).to(embeds.dtype)
                where = to_device(where, self.device)
                # = masked_scatter / masked_fill over the audio (image, video) positions, without their
                # host sync; the talker sees zero embeddings there, as generate() hands them to it
                talker_embeds = talker_embeds.index_fill(1, where, 0.0)
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

    @property
    def audio_decoder(self) -> Token2WavRunner:
        return self.token2wav

    def release(self) -> None:
        self.thinker_pool = self.talker_pool = self.talker_history = None
        self.thinker_decode = self.talker_decode = self.token2wav = None
        self.thinker_chunk = self.talker_chunk = None
        self.encoder_cache.clear()

    def profiled_steps(self) -> dict[str, dict[str, ProfiledStep]]:
        """The captured steps (ModelRunner.profiled_steps): the thinker's and talker's decode
        steps by batch bucket; a 128-token prompt chunk (about a turn's new tokens for 3 s
        of speech) ending at each attention window's end, where a longer conversation's
        prefill grows, by "128/window"; token2wav's ODE solves and vocoder chunks."""
        steps: dict[str, dict[str, ProfiledStep]] = {}
        for name, decode in (("thinker", self.thinker_decode), ("talker", self.talker_decode)):
            steps[name] = {}
            for (batch,), graph in sorted(decode.graphs.items()):
                inputs = decode.inputs[batch]
                view = inputs[2] if isinstance(inputs, tuple) else inputs.view
                steps[name][str(batch)] = ProfiledStep(graph.replay, lambda view=view: view.point([], []))
        for name, chunk in (("thinker chunk", self.thinker_chunk), ("talker chunk", self.talker_chunk)):
            steps[name] = {}
            for (bucket, window), graph in sorted(chunk.graphs.items()):
                if bucket == 128:
                    view, scratch = chunk.inputs[bucket][2], chunk.pool.scratch
                    steps[name][f"{bucket}/{window}"] = ProfiledStep(
                        graph.replay, lambda view=view, at=window - bucket: view.point([scratch], [at]))
        return {**steps, **self.token2wav.profiled_steps()}


class _TalkerDecode:
    """The talker's batched decode step, sampling inside: static inputs per batch bucket, a
    graph per bucket."""

    def __init__(self, runner: Qwen2_5Runner, cuda_graphs: bool, compile: bool) -> None:
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


