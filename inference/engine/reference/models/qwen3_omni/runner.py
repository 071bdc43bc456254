"""Qwen3-Omni's model runner: the same interface as runner.py's (the engine loop cannot tell
them apart), over Qwen3-Omni's modules from transformers.

What one reply's talker reads, as `Qwen3OmniMoeForConditionalGeneration.generate` builds it:

- its prompt part: the user turns of the prompt only (its `TalkerFeed`), each token as
  `hidden_projection` of the thinker's states after `accept_hidden_layer` layers where it is
  audio, else `text_projection` of its embedding; prefilled chunk by chunk beside the
  thinker's prompt chunks (a chunk's user tokens go in with it);
- its start, 9 rows: "<|im_start|>assistant\\n" (projected), four tts-pad rows carrying the
  codec's nothink / think-bos / think-eos / speaker codes, tts-bos with codec-pad, and the
  first reply token with codec-bos; the last row's logits give the first frame's first code;
- then one step a frame: the sum of the last frame's code embeddings (the talker's own for
  the first code, the code predictor's for the others) plus the next reply token's projected
  embedding (the stop token's too), then tts-eos once, then tts-pad.

A frame is 16 codes (`num_code_groups`): the talker's step samples the first; the code
predictor, a small dense transformer, then writes the other 15 one after another from [the
talker's last hidden state, the first code's embedding]. Here its 15 steps run inside the
talker's step, batched over every reply, as one captured graph on CUDA: its sequence is at
most 16 rows, so each step recomputes it whole under a causal mask instead of keeping a KV
cache (the same math, static shapes). MoE layers run transformers' grouped-GEMM experts on
CUDA (`grouped_mm`: routing on the device, no host sync, capturable); on a CPU its eager
experts. Decode steps are captured per batch bucket, as runner.py's; prompt chunks and the
talker's start run eagerly (a few per turn).
"""

from __future__ import annotations

import logging
import time

import torch

from ...attention import use_pool_attention
from ...compiled import compile_step
from ...cuda_graphs import CapturedStep, batch_buckets, bucket_for, capture_each
from ...device_runner import DeviceRunner
from ...encoder_cache import EncoderCache
from ...host_copy import copy_from_host, to_device
from ...kv_pool import BatchView, KVPool, forward
from ...prompt import Clip, Picture, Video, audio_features
from ...sampling import NOISE_STEPS, NoiseBank, SamplingParams, TokenSampler
from ...text_steps import PREFILL_BUCKETS, ChunkForward, ThinkerDecode, ThinkerStep, rope_positions
from ..base import ProfiledStep
from .code2wav_runner import Code2WavRunner
from .code2wav_stream import Code2WavPlan
from .layers import predictor_layer, talker_layer, thinker_layer
from .vision import encode_pictures, encode_video, split_features

logger = logging.getLogger(__name__)

# the code predictor's sampling in generate(): top-k 50, top-p 0.8 when the talker samples
CODE_PREDICTOR_TOP_K, CODE_PREDICTOR_TOP_P = 50, 0.8
# generate() suppresses the top 1024 talker ids (codec specials) but the end code
SPECIAL_CODES = 1024
START_ROWS = 9  # the talker's start after its prompt part (module doc)


class Qwen3Runner(DeviceRunner):
    @torch.inference_mode()
    def __init__(self, model, processor, *, slots: int, thinker_capacity: int,
                 talker_capacity: int, talker_sampling: SamplingParams, device: torch.device,
                 cuda_graphs: bool, encoder_cache_bytes: int, prefill_chunk_tokens: int,
                 talker_stream: bool = False, compile: bool = False,
                 code2wav_plan: Code2WavPlan) -> None:
        started = time.monotonic()
        self.model = model
        self.thinker = model.thinker
        self.talker = model.talker
        self.predictor = model.talker.code_predictor
        self._init_device(device, cuda_graphs, talker_stream)
        self.slots = slots
        config = model.config
        talker_config = self.talker.config
        self.codes_per_frame = talker_config.num_code_groups
        self.talker_start_rows = START_ROWS
        self.accept_layer = talker_config.accept_hidden_layer
        self.audio_id = self.thinker.config.audio_token_id
        self.image_id = self.thinker.config.image_token_id
        self.video_id = self.thinker.config.video_token_id
        text_config = self.thinker.config.text_config
        talker_text = talker_config.text_config
        if device.type == "cuda":  # routing on the device: capturable, no per-expert loop
            text_config._experts_implementation = "grouped_mm"
            talker_text._experts_implementation = "grouped_mm"
        dtype = self.thinker.lm_head.weight.dtype
        use_pool_attention(text_config, talker_text)  # their layers attend through the pools
        self.thinker_pool = KVPool(text_config, slots, thinker_capacity, device, dtype)
        self.talker_pool = KVPool(talker_text, slots, talker_capacity, device,
                                  self.talker.codec_head.weight.dtype)
        vocab = talker_text.vocab_size
        self.codec_eos = talker_config.codec_eos_token_id
        suppressed = [c for c in range(max(vocab - SPECIAL_CODES, 0), vocab) if c != self.codec_eos]
        self.talker_sampler = TokenSampler(talker_sampling, device, suppress_ids=suppressed)
        self.predictor_sampler = TokenSampler(SamplingParams(
            do_sample=talker_sampling.do_sample, top_k=CODE_PREDICTOR_TOP_K,
            top_p=CODE_PREDICTOR_TOP_P), device)
        # the first codes each slot has made (the repetition penalty's history), by talker KV
        # position; the other places hold the codec pad code, which is suppressed anyway
        self.history_fill = talker_config.codec_pad_id
        self.talker_history = torch.full((slots + 1, talker_capacity + 1), self.history_fill,
                                         dtype=torch.long, device=device)
        self.is_end = torch.zeros((1, vocab), dtype=torch.bool, device=device)
        self.is_end[0, self.codec_eos] = True
        embed = self.thinker.get_input_embeddings()
        specials = torch.tensor([[config.tts_bos_token_id, config.tts_eos_token_id,
                                  config.tts_pad_token_id]], device=device)
        projected = self.talker.text_projection(embed(specials))
        self.tts_bos, self.tts_eos, self.tts_pad = (projected[:, i:i + 1].clone() for i in range(3))
        codec = self.talker.get_input_embeddings()
        self.speaker_codes = {name.lower(): code for name, code in talker_config.speaker_id.items()}
        self.start_codes = [talker_config.codec_nothink_id, talker_config.codec_think_bos_id,
                            talker_config.codec_think_eos_id]
        self.codec_pad_bos = codec(torch.tensor([[talker_config.codec_pad_id,
                                                  talker_config.codec_bos_id]], device=device))
        self.feature_extractor = processor.feature_extractor
        self.image_processor = processor.image_processor
        self.video_processor = processor.video_processor
        self.encoder_cache = EncoderCache(self._encode, encoder_cache_bytes, encode_pictures=self._encode_pictures)
        self.buckets = batch_buckets(slots)
        self.thinker_decode = ThinkerDecode(self, thinker_layer, cuda_graphs, compile)
        buckets = [size for size in PREFILL_BUCKETS if size < prefill_chunk_tokens] + [prefill_chunk_tokens]
        self.thinker_chunk = ChunkForward(self, self.thinker.model, self.thinker_pool,
                                          text_config.hidden_size, dtype, buckets, cuda_graphs,
                                          keep_layer=self.accept_layer)
        # the talker's chunks: its prompt part (a chunk's user tokens) and its 9 start rows
        self.talker_chunk = ChunkForward(self, self.talker.model, self.talker_pool,
                                         talker_text.hidden_size, self.talker.codec_head.weight.dtype,
                                         [START_ROWS] + buckets, cuda_graphs)
        self.frame_decode = _FrameDecode(self, cuda_graphs, compile)
        self.code2wav = Code2WavRunner(model.code2wav, code2wav_plan, device, cuda_graphs, slots)
        logger.info("Qwen3-Omni runner: %d KV slots (thinker %d tokens, talker %d), %d codes a "
                    "frame, batch buckets %s, CUDA graphs %s, compiled %s, in %.1f s", slots,
                    thinker_capacity, talker_capacity, self.codes_per_frame, self.buckets,
                    "on" if cuda_graphs else "off", "yes" if compile else "no",
                    time.monotonic() - started)

    @property
    def audio_decoder(self) -> Code2WavRunner:
        return self.code2wav

    def release(self) -> None:
        self.thinker_pool = self.talker_pool = self.talker_history = None
        self.thinker_decode = self.frame_decode = self.code2wav = None
        self.thinker_chunk = self.talker_chunk = None
        self.encoder_cache.clear()

    def profiled_steps(self) -> dict[str, dict[str, ProfiledStep]]:
        """The steps a profile times (ModelRunner.profiled_steps): the captured thinker and
        frame steps by batch bucket, the code predictor alone per bucket (captured here),
        code2wav's windows; and "eager", the parts on the way to the first audio that run
        eagerly: the audio encoder on 3 s, a 64-token prompt chunk, the talker's start rows,
        the code predictor for one reply."""
        frame, device = self.frame_decode, self.device
        steps: dict[str, dict[str, ProfiledStep]] = {"thinker": {}, "frame": {}, "code_predictor": {}}
        for (batch,), graph in sorted(self.thinker_decode.graphs.items()):
            view = self.thinker_decode.inputs[batch][2]
            steps["thinker"][str(batch)] = ProfiledStep(graph.replay, lambda view=view: view.point([], []))
        talker_width = self.talker.config.text_config.hidden_size
        dtype = self.thinker.lm_head.weight.dtype
        for (batch,), graph in sorted(frame.graphs.items()):
            inputs = frame.inputs[batch]
            steps["frame"][str(batch)] = ProfiledStep(graph.replay, lambda view=inputs.view: view.point([], []))
            hidden = torch.zeros((batch, 1, talker_width), dtype=self.talker.codec_head.weight.dtype,
                                 device=device)
            first = torch.zeros((batch,), dtype=torch.long, device=device)
            predictor = CapturedStep(lambda hidden=hidden, first=first, noise=inputs.predictor_noise:
                                     frame._residuals(hidden, first, noise), self.capture_stream)
            steps["code_predictor"][str(batch)] = ProfiledStep(predictor.replay)
        steps.update(self.code2wav.profiled_steps())

        samples = torch.randn(48_000, generator=torch.Generator().manual_seed(0)).numpy() * 0.05
        clip = Clip(key=1, samples=samples, frames=300, tokens=39)
        embeds = torch.zeros((1, 64, self.thinker.config.text_config.hidden_size), dtype=dtype, device=device)
        positions = torch.arange(64, device=device).view(1, 1, 64).expand(3, 1, 64)
        view = BatchView(self.thinker_pool, 1, 64)
        rows = torch.zeros((1, START_ROWS, talker_width), dtype=dtype, device=device)
        talker_view = BatchView(self.talker_pool, 1, START_ROWS)
        talker_positions = torch.arange(START_ROWS, device=device).view(1, 1, -1).expand(3, 1, START_ROWS)
        one = torch.zeros((1, 1, talker_width), dtype=dtype, device=device)
        zero = torch.zeros((1,), dtype=torch.long, device=device)
        steps["eager"] = {
            "audio_encoder_3s": ProfiledStep(lambda: self._encode_clip(clip)),
            "thinker_chunk_64": ProfiledStep(
                lambda: forward(self.thinker.model, view, embeds, positions, keep_layer=self.accept_layer),
                lambda: view.point([], [])),
            f"talker_start_{START_ROWS}_rows": ProfiledStep(
                lambda: forward(self.talker.model, talker_view, rows, talker_positions),
                lambda: talker_view.point([], [])),
            "code_predictor_1": ProfiledStep(
                lambda: frame._residuals(one, zero, frame.inputs[1].predictor_noise)),
        }
        return steps

    # ----------------------------------------------------------------- prefill

    def prefill(self, reply, start: int, end: int) -> torch.Tensor | None:
        """Prompt tokens [start, end) into the reply's thinker slot, and (a spoken reply) the
        talker's prompt tokens that come from them into its talker slot."""
        prompt, prepared = reply.prompt, reply.prepared
        ids = prompt.input_ids[:, start:end]
        text_embeds = self.thinker.get_input_embeddings()(to_device(ids, self.device))
        embeds, deepstack = text_embeds, None
        for token_id, media in ((self.audio_id, prompt.clips), (self.image_id, prompt.pictures),
                                (self.video_id, prompt.videos)):
            where = (ids[0] == token_id).nonzero().squeeze(1)
            if not where.numel():
                continue
            first_row = int((prompt.input_ids[0, :start] == token_id).sum())
            rows = self.encoder_cache.rows(media, first_row, where.numel()).to(embeds.dtype)
            where = to_device(where, self.device)
            if token_id != self.audio_id:  # pictures' and videos' deepstack rows, at their tokens
                rows, layers = split_features(rows, embeds.shape[-1])
                if deepstack is None:
                    deepstack = [torch.zeros_like(embeds) for _ in layers]
                deepstack = [done.index_copy(1, where, layer[None]) for done, layer in zip(deepstack, layers)]
            embeds = embeds.index_copy(1, where, rows[None])
        hidden, kept = self.thinker_chunk(reply.slot, embeds, prepared.thinker_positions[:, :, start:end],
                                          start, after_layers=deepstack)
        logits = self.thinker.lm_head(hidden[:, -1]) if end == prompt.length else None
        if reply.talker is not None:
            feed = prepared.talker_feed
            first, last = feed.tokens_before(start), feed.tokens_before(end)
            if last > first:
                # audio, picture and video tokens: the thinker's states at the talker's layer; the
                # others: their text embedding (generate()'s multimodal mask)
                media = (ids[0] == self.audio_id) | (ids[0] == self.image_id) | (ids[0] == self.video_id)
                picked = to_device(feed.sources[first:last] - start, self.device)
                is_media = to_device(media, self.device)[picked][None, :, None]
                inputs = torch.where(is_media, self.talker.hidden_projection(kept[:, picked]),
                                     self.talker.text_projection(text_embeds[:, picked]))
                self._talker_chunk(reply, inputs, first)
        return logits

    def _talker_chunk(self, reply, inputs: torch.Tensor, start: int) -> torch.Tensor:
        """Talker rows `inputs` (1, n, H) into the reply's talker slot from position `start`;
        returns the final states (1, n, H)."""
        length = inputs.shape[1]
        return self.talker_chunk(reply.slot, inputs,
                                 reply.prepared.talker_positions[:, :, start:start + length], start)

    # ----------------------------------------------------------------- decode

    def thinker_step(self, replies) -> ThinkerStep:
        return self.thinker_decode.step(replies)

    def talker_start(self, reply) -> torch.Tensor:
        """The talker's 9 start rows after its prompt part; returns the first frame (1, G)."""
        prompt, talker = reply.prompt, reply.talker
        first_token = talker.next_element().token
        embed = self.thinker.get_input_embeddings()
        opening = prompt.input_ids[0, -3:].tolist()  # "<|im_start|>assistant\n"
        text = self.talker.text_projection(embed(to_device([opening + [first_token]], self.device)))
        codec = self.talker.get_input_embeddings()(to_device(
            [self.start_codes + [self.speaker_codes[reply.voice.lower()]]], self.device))
        rows = torch.cat([text[:, :3], self.tts_pad.expand(1, 4, -1) + codec,
                          self.tts_bos + self.codec_pad_bos[:, :1],
                          text[:, 3:] + self.codec_pad_bos[:, 1:]], dim=1)
        hidden = self._talker_chunk(reply, rows, reply.prepared.talker_feed.length)
        self.talker_history[reply.slot].fill_(self.history_fill)
        return self.frame_decode.first_frame(reply, hidden[:, -1:])

    def talker_step(self, replies) -> torch.Tensor:
        """One frame for each reply; (B, G) codes on the device."""
        return self.frame_decode(replies)

    def launch_audio(self, replies):
        with self.code2wav.side_stream():
            windows = [r.audio.next_window(final=not r.audio.ready()) for r in replies]
            return self.code2wav.decode(windows)

    # ----------------------------------------------------------------- encoders

    def _encode(self, item: Clip | Picture | Video) -> torch.Tensor:
        """What the thinker reads at one clip's (picture's, video's) tokens: (tokens, H) for a
        clip, (tokens, (1 + deepstack) × H) for a picture or a video's frames (vision.py)."""
        if isinstance(item, Video):
            return encode_video(self.thinker, self.video_processor, item, self.device)
        if isinstance(item, Picture):
            return self._encode_pictures([item])[0]
        return self._encode_clip(item)

    def _encode_pictures(self, pictures: list[Picture]) -> list[torch.Tensor]:
        """(tokens, (1 + deepstack) × H) of each picture, the pictures encoded as one batch."""
        return encode_pictures(self.thinker, self.image_processor, pictures, self.device)

    def _encode_clip(self, clip: Clip) -> torch.Tensor:
        features, mask = audio_features(self.feature_extractor, [clip.samples])
        dtype = self.thinker.lm_head.weight.dtype
        out = self.thinker.get_audio_features(features.to(self.device, dtype),
                                              feature_attention_mask=mask.to(self.device))
        return out.last_hidden_state


class _FrameDecode:
    """The talker's batched frame step, the code predictor inside: static inputs per batch
    bucket, a graph per bucket (CUDA)."""

    def __init__(self, runner: Qwen3Runner, cuda_graphs: bool, compile: bool) -> None:
        self.runner = runner
        device = runner.device
        talker = runner.talker
        self.groups = runner.codes_per_frame
        vocab = talker.config.text_config.vocab_size
        predictor_vocab = runner.predictor.config.vocab_size
        self.inputs = {}
        for batch in runner.buckets:
            self.inputs[batch] = _FrameInputs(
                last_frame=torch.zeros((batch, self.groups), dtype=torch.long, device=device),
                tokens=torch.zeros((batch,), dtype=torch.long, device=device),
                kinds=torch.zeros((batch,), dtype=torch.long, device=device),
                positions=torch.zeros((3, batch, 1), dtype=torch.long, device=device),
                view=BatchView(runner.talker_pool, batch, 1),
                noise=torch.ones((batch, vocab), dtype=torch.float32, device=device),
                predictor_noise=torch.ones((batch, self.groups - 1, predictor_vocab),
                                           dtype=torch.float32, device=device),
                mask_end=torch.zeros((batch, 1), dtype=torch.bool, device=device))
        # the frame steps' sampling draws, a slot's NOISE_STEPS at a time (sampling.NoiseBank)
        self.noise = NoiseBank(runner.talker_sampler, runner.slots, NOISE_STEPS, vocab, device)
        self.predictor_noise = NoiseBank(runner.predictor_sampler, runner.slots, NOISE_STEPS,
                                         (self.groups - 1) * predictor_vocab, device)
        self.layer_step = compile_step(talker_layer, compile)
        self.predictor_step = compile_step(predictor_layer, compile)
        positions = torch.arange(self.groups, device=device)[None]
        self.predictor_positions = positions
        self.predictor_mask = (positions[0][None, :] <= positions[0][:, None])[None, None]
        # the first frame (from the talker start's last state), one reply at a time
        width = talker.config.text_config.hidden_size
        self.first = _FrameInputs(
            hidden=torch.zeros((1, 1, width), dtype=talker.codec_head.weight.dtype, device=device),
            rows=torch.zeros((1,), dtype=torch.long, device=device),
            at=torch.zeros((1,), dtype=torch.long, device=device),
            mask_end=torch.zeros((1, 1), dtype=torch.bool, device=device),
            # its own draws: the frame step may be reading batch 1's on the talker's stream
            noise=torch.ones((1, vocab), dtype=torch.float32, device=device),
            predictor_noise=torch.ones((1, self.groups - 1, predictor_vocab), dtype=torch.float32,
                                       device=device))
        self.graphs = capture_each(self._run, [(batch,) for batch in runner.buckets],
                                   runner.talker_capture_stream, runner.talker_graph_pool,
                                   "talker frame") if cuda_graphs else {}
        # the first frame replays on the loop's stream, in the talker's start
        self.first_graph = (CapturedStep(self._first, runner.capture_stream, runner.graph_pool)
                            if cuda_graphs else None)

    def __call__(self, replies) -> torch.Tensor:
        runner = self.runner
        count = len(replies)
        batch = bucket_for(count, runner.buckets)
        buffers = self.inputs[batch]
        pad = batch - count
        tokens, kinds = [], []
        for reply in replies:
            element = reply.talker.next_element()
            if element is None:
                tokens.append(0), kinds.append(PAD)
            elif element.token is None:
                tokens.append(0), kinds.append(EOS)
            else:
                tokens.append(element.token), kinds.append(TEXT)
        frames = [r.talker.last_frame for r in replies] + [[0] * self.groups] * pad
        copy_from_host(buffers.last_frame, frames)
        copy_from_host(buffers.tokens, tokens + [0] * pad)
        copy_from_host(buffers.kinds, kinds + [PAD] * pad)
        lengths = [r.talker.length for r in replies]
        copy_from_host(buffers.positions, rope_positions(
            lengths, [r.prepared.talker_rope_delta for r in replies], pad))
        copy_from_host(buffers.mask_end, [r.talker.codes < r.talker.min_codes for r in replies]
                       + [False] * pad)
        if runner.talker_sampler.params.do_sample:  # each slot's next steps' draws, gathered
            slots, generators = [r.slot for r in replies], [r.generator for r in replies]
            self.noise.take(buffers.noise, slots, generators)
            self.predictor_noise.take(buffers.predictor_noise.view(batch, -1), slots, generators)
        buffers.view.point([r.slot for r in replies], lengths)
        graph = self.graphs.get((batch,))
        frame = graph.replay() if graph is not None else self._run(batch)
        return frame[:count]

    def first_frame(self, reply, hidden: torch.Tensor) -> torch.Tensor:
        """The first frame (1, G) from the talker start's last state (1, 1, H)."""
        first = self.first
        runner = self.runner
        if runner.talker_sampler.params.do_sample:  # its own draws, straight from its generator
            runner.talker_sampler.draw_noise(first.noise, reply.generator)
            runner.predictor_sampler.draw_noise(first.predictor_noise[0], reply.generator)
        self.noise.restart(reply.slot)  # its frame steps draw afresh from its generator
        self.predictor_noise.restart(reply.slot)
        first.hidden.copy_(hidden)
        first.rows.fill_(reply.slot)
        first.at.fill_(reply.talker.length - 1)
        first.mask_end.fill_(reply.talker.codes < reply.talker.min_codes)
        if self.first_graph is None:
            return self._first()
        # a copy: another reply's start in the same step replays this graph again
        return self.first_graph.replay().clone()

    def _first(self) -> torch.Tensor:
        first = self.first
        return self._sample_frame(first.hidden, first.rows, first.at, first.mask_end,
                                  first.noise, first.predictor_noise)

    def _run(self, batch: int) -> torch.Tensor:
        runner = self.runner
        buffers = self.inputs[batch]
        talker, predictor = runner.talker, runner.predictor
        last = buffers.last_frame
        inputs = talker.get_input_embeddings()(last[:, :1])
        for group in range(1, self.groups):
            inputs = inputs + predictor.get_input_embeddings()[group - 1](last[:, group:group + 1])
        text = talker.text_projection(runner.thinker.get_input_embeddings()(buffers.tokens[:, None]))
        kinds = buffers.kinds[:, None, None]
        text = torch.where(kinds == TEXT, text, torch.where(kinds == EOS, runner.tts_eos, runner.tts_pad))
        view = buffers.view
        hidden = forward(talker.model, view, inputs + text, buffers.positions, self.layer_step)
        return self._sample_frame(hidden, view.rows, view.write_pos[:, -1], buffers.mask_end,
                                  buffers.noise, buffers.predictor_noise)

    def _sample_frame(self, hidden: torch.Tensor, rows: torch.Tensor, at: torch.Tensor,
                      mask_end: torch.Tensor, noise: torch.Tensor,
                      predictor_noise: torch.Tensor) -> torch.Tensor:
        """(B, G) codes from the talker's last states (B, 1, H): the first code sampled with
        the history penalty and recorded in the history at KV position `at` (B,), the rest
        by the code predictor."""
        runner = self.runner
        logits = runner.talker.codec_head(hidden[:, -1])
        masked = torch.where(mask_end & runner.is_end, float("-inf"), logits)
        history = runner.talker_history.index_select(0, rows) if runner.talker_sampler.needs_history else None
        first = runner.talker_sampler.sample_on_device(masked, history, noise)
        runner.talker_history.index_put_((rows, at), first[:, 0])
        return torch.cat([first, self._residuals(hidden, first[:, 0], predictor_noise)], dim=1)

    def _residuals(self, hidden: torch.Tensor, first: torch.Tensor,
                   noise: torch.Tensor) -> torch.Tensor:
        """The code predictor's G - 1 codes for each row: sequence [talker state, first code's
        embedding, residual codes' embeddings], recomputed whole each step (module doc)."""
        runner = self.runner
        predictor = runner.predictor
        model = predictor.model
        embeddings = predictor.get_input_embeddings()
        rows = hidden.shape[0]
        width = model.config.hidden_size
        sequence = torch.zeros((rows, self.groups, width), dtype=hidden.dtype, device=hidden.device)
        sequence[:, 0] = hidden[:, -1]
        sequence[:, 1] = runner.talker.get_input_embeddings()(first)
        rotary = model.rotary_emb(sequence, self.predictor_positions)
        codes = []
        for group in range(1, self.groups):
            states = sequence
            for layer in model.layers:
                states = self.predictor_step(layer, states, self.predictor_mask, rotary)
            states = model.norm(states)
            logits = predictor.lm_head[group - 1](states[:, group])
            code = runner.predictor_sampler.sample_on_device(logits, None, noise[:, group - 1])
            codes.append(code)
            if group + 1 < self.groups:
                sequence = sequence.clone()
                sequence[:, group + 1] = embeddings[group - 1](code[:, 0])
        return torch.cat(codes, dim=1)


TEXT, EOS, PAD = 0, 1, 2  # what a frame step's text row is: a token's, tts-eos, tts-pad


class _FrameInputs:
    def __init__(self, **tensors) -> None:
        self.__dict__.update(tensors)
