"""The talker, one codec code per step, fed in lockstep with the thinker.

Reproduces what `Qwen2_5OmniForConditionalGeneration.generate` + the talker's `forward` do,
but incrementally:

- prefill input = thinker (final hidden + input embedding) of every prompt token (embeddings
  zeroed at audio positions), then the speaker's text-bos embedding, then the first reply
  token's hidden + embedding; the codec pad and codec bos embeddings are added to the last
  two positions; rope positions from the talker's `get_rope_index` over
  `[prompt ids, speaker bos, first reply token]`;
- decode step j input = codec embedding of the previous code + the reply element j, where
  the reply stream is reply token j's (hidden + embedding), then the text-eos embedding once
  the text is over, then the text-pad embedding for as long as the talker keeps talking;
- each input goes through `thinker_to_talker_proj`, the talker model, `codec_head`;
- sampling as generate's defaults: repetition penalty over the whole code sequence (the
  codec mask codes standing for the prompt included), codec bos suppressed, temperature /
  top-k / top-p; the codec pad and codec end codes both end the speech.

One deliberate difference: codes the token2wav cannot embed (beyond its codebook, other than
the end codes) are suppressed too; generate would crash in token2wav on them.

The prefill and decode steps use transformers' DynamicCache or, on the fast path, a
`TalkerStaticStep` (a static KV cache; on CUDA the prefill and the step, sampling included,
are replayed from CUDA graphs; see static_cache.py).
"""

from __future__ import annotations

from functools import partial

import torch
from transformers import DynamicCache

from .cuda_graphs import CapturedStep
from .sampling import TokenSampler
from .static_cache import StaticKVCache, StaticPrefill, forward_with_static_cache


def suppressed_codes(config, codebook_size: int) -> list[int]:
    """Codes the talker must never sample: codec bos, and codes token2wav cannot embed
    (beyond its codebook) other than the end codes."""
    end_codes = {config.tts_codec_pad_token_id, config.tts_codec_end_token_id}
    unusable = [c for c in range(codebook_size, config.vocab_size) if c not in end_codes]
    return sorted({config.tts_codec_start_token_id, *unusable})


class TalkerStaticStep:
    """The talker on a preallocated KV cache, for one generation at a time: its prefill
    (`StaticPrefill`) and one decode step (codec embedding of the last code + reply element
    → logits), on CUDA one captured graph per attention window.

    With a `sampler` the step also chooses the next code on the device (`sample_on_device`,
    the same choice as the eager sampler given the same random draws): it reads the last
    code from `code` and writes the new one there and into `history`, the codes the
    repetition penalty looks at. `history` is padded past the reply with the codec mask code,
    which its prompt part always holds, so the penalty sees the same set of codes."""

    def __init__(self, talker, capacity: int, reply_width: int, device: torch.device,
                 cuda_graphs: bool, sampler: TokenSampler | None = None) -> None:
        config = talker.config
        self.talker = talker
        self.sampler = sampler
        dtype = talker.codec_head.weight.dtype
        self.cache = StaticKVCache(config, capacity, device, dtype)
        self.prefill = StaticPrefill(talker.model, self.cache, reply_width, dtype, device,
                                     cuda_graphs, project=talker.thinker_to_talker_proj)
        self.code = torch.zeros((1, 1), dtype=torch.long, device=device)
        self.reply_input = torch.zeros((1, 1, reply_width), dtype=dtype, device=device)
        self.position = torch.zeros((3, 1, 1), dtype=torch.long, device=device)
        vocab = config.vocab_size
        self.history = torch.full((1, capacity + 1), config.tts_codec_mask_token_id,
                                  dtype=torch.long, device=device)
        self.noise = torch.ones((1, vocab), dtype=torch.float32, device=device)
        self.mask_end = torch.zeros((), dtype=torch.bool, device=device)  # before min length
        self.is_end = torch.zeros((1, vocab), dtype=torch.bool, device=device)
        self.is_end[0, [config.tts_codec_pad_token_id, config.tts_codec_end_token_id]] = True
        self.graphs = {window: CapturedStep(partial(self._run, window))
                       for window in self.cache.windows} if cuda_graphs else {}

    def __call__(self, reply_input: torch.Tensor, slot: int, position: int,
                 code: int | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One step writing KV slot `slot`; `code`: the last code, or None if `self.code`
        already holds it. Returns (logits, the chosen code or None without a sampler)."""
        if code is not None:
            self.code.fill_(code)
        self.reply_input.copy_(reply_input)
        self.position.fill_(position)
        self.cache.write_at.fill_(slot)
        window = self.cache.window_for(slot + 1)
        graph = self.graphs.get(window)
        return graph.replay() if graph is not None else self._run(window)

    def _run(self, window: int) -> tuple[torch.Tensor, torch.Tensor | None]:
        self.cache.window = window
        inputs = self.talker.get_input_embeddings()(self.code) + self.reply_input
        hidden = forward_with_static_cache(
            self.talker.model, self.cache, self.talker.thinker_to_talker_proj(inputs),
            self.position, start=None)
        logits = self.talker.codec_head(hidden[:, -1])
        if self.sampler is None:
            return logits, None
        masked = torch.where(self.mask_end & self.is_end, float("-inf"), logits)
        history = self.history if self.sampler.needs_history else None
        code = self.sampler.sample_on_device(masked, history, self.noise)
        self.code.copy_(code)
        self.history.index_copy_(1, self.cache.write_at.view(1) + 1, code)
        return logits, code


class TalkerRunner:
    def __init__(self, talker, codebook_size: int, sampler_factory, max_codes: int,
                 device: torch.device, min_codes: int = 0,
                 static: TalkerStaticStep | None = None) -> None:
        config = talker.config
        self.talker = talker
        self.static = static
        self.device = device
        self.max_codes = max_codes
        self.min_codes = min_codes  # end codes are masked until then (generate's min_new_tokens)
        self.codec_bos = config.tts_codec_start_token_id
        self.codec_pad = config.tts_codec_pad_token_id
        self.codec_mask = config.tts_codec_mask_token_id
        self.end_codes = {config.tts_codec_pad_token_id, config.tts_codec_end_token_id}
        self.sampler: TokenSampler = sampler_factory(suppressed_codes(config, codebook_size))
        # the static step samples on the device if it was built for this very sampling
        self.samples_on_device = (static is not None and static.sampler is not None
                                  and static.sampler.params == self.sampler.params)
        self.cache = None if static is not None else DynamicCache(config=config)
        self.rope_delta = 0
        self.length = 0
        self.last_code: int | None = None
        self.codes = 0
        self._history: torch.Tensor | None = None
        self._history_len = 0
        self._code_on_device = False  # the static step's `code` holds last_code
        self._end_masked: bool | None = None  # what the static step's mask_end holds

    @property
    def finished(self) -> bool:
        return self.last_code in self.end_codes or self.codes >= self.max_codes

    def start(self, prompt_ids: torch.Tensor, prompt_inputs: torch.Tensor,
              speaker_bos_id: int, speaker_bos_embed: torch.Tensor,
              first_reply_id: int, first_reply_input: torch.Tensor,
              audio_lengths: torch.Tensor | None) -> int:
        """Prefill; returns the first code. `prompt_inputs` = hidden + embeds of the prompt."""
        inputs = torch.cat([prompt_inputs, speaker_bos_embed, first_reply_input], dim=1).clone()
        inputs[:, -1] += self._codec_embed(self.codec_bos)[:, 0]
        inputs[:, -2] += self._codec_embed(self.codec_pad)[:, 0]
        # rope positions on the CPU, where the prompt is: no host sync
        text_ids = torch.cat([
            prompt_ids.cpu(), torch.tensor([[speaker_bos_id, first_reply_id]], dtype=torch.long),
        ], dim=1)
        positions, deltas = self.talker.get_rope_index(
            text_ids, None, None, torch.ones_like(text_ids), False,
            None if audio_lengths is None else audio_lengths.cpu(), None)
        positions = positions.to(self.device)
        self.rope_delta = int(deltas.reshape(-1)[0])
        prompt_len = prompt_ids.shape[1]
        if self.static is not None:  # its full-length buffer, padded with the mask code
            self._history = self.static.history
            self._history.fill_(self.codec_mask)
        else:
            self._history = torch.empty((1, prompt_len + 3 + self.max_codes), dtype=torch.long,
                                        device=self.device)
            self._history[0, :prompt_len] = self.codec_mask
        self._history[0, prompt_len] = self.codec_pad
        self._history[0, prompt_len + 1] = self.codec_bos
        self._history_len = prompt_len + 2
        if self.static is not None:
            hidden = self.static.prefill(inputs, positions)
        else:
            hidden = self.talker.model(
                inputs_embeds=self.talker.thinker_to_talker_proj(inputs), position_ids=positions,
                past_key_values=self.cache, use_cache=True, return_dict=True).last_hidden_state
        self.length += inputs.shape[1]
        return self._next_code(self.talker.codec_head(hidden[:, -1]))

    def step(self, reply_input: torch.Tensor) -> int:
        """One decode step with reply element `reply_input` (1, 1, H); returns the next code."""
        position = self.length + self.rope_delta
        if self.static is not None:
            return self._static_step(reply_input, position)
        inputs = self._codec_embed(self.last_code) + reply_input
        positions = torch.full((3, 1, 1), position, dtype=torch.long, device=self.device)
        projected = self.talker.thinker_to_talker_proj(inputs)
        hidden = self.talker.model(inputs_embeds=projected, position_ids=positions,
                                   past_key_values=self.cache, use_cache=True,
                                   return_dict=True).last_hidden_state
        self.length += 1
        return self._next_code(self.talker.codec_head(hidden[:, -1]))

    def _static_step(self, reply_input: torch.Tensor, position: int) -> int:
        static = self.static
        if self.samples_on_device:
            end_masked = self.codes < self.min_codes
            if end_masked != self._end_masked:
                static.mask_end.fill_(end_masked)
                self._end_masked = end_masked
            if self.sampler.params.do_sample:
                self.sampler.draw_noise(static.noise)
        logits, code = static(reply_input, self.length, position,
                              None if self._code_on_device else self.last_code)
        self.length += 1
        if not self.samples_on_device:  # the step's own choice, if any, is overwritten here
            return self._next_code(logits)
        self._code_on_device = True
        self._history_len += 1  # the step wrote the code into the history itself
        return self._record(int(code))

    def _next_code(self, logits: torch.Tensor) -> int:
        history = self._history[:, :self._history_len] if self.sampler.needs_history else None
        if self.codes < self.min_codes:
            logits = logits.clone()
            logits[:, sorted(self.end_codes)] = float("-inf")
        code = self.sampler(logits, history)
        self._history[0, self._history_len] = code
        self._history_len += 1
        self._code_on_device = False
        return self._record(code)

    def _record(self, code: int) -> int:
        self.last_code = code
        if code not in self.end_codes:
            self.codes += 1
        return code

    def _codec_embed(self, code: int) -> torch.Tensor:
        ids = torch.tensor([[code]], dtype=torch.long, device=self.device)
        return self.talker.get_input_embeddings()(ids)

    def release(self) -> None:
        self.cache = None
        self.static = None
        self._history = None
