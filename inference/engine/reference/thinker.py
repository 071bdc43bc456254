"""The thinker, one step at a time, returning what the talker needs from every token.

Mirrors `Qwen2_5OmniThinkerForConditionalGeneration.forward` for a single, unpadded sequence:
token embeddings with the audio encoder's output scattered into the `<|AUDIO|>` positions,
3D rope positions from the model's own `get_rope_index`, then the text model and `lm_head`.
Positions are computed here and passed in explicitly, so the module's cached `rope_deltas`
(shared state) is never touched and several generations can share one model.

Per fed token the talker needs the token's input embedding and the final (normed) hidden
state, i.e. `hidden_states[0]` and `hidden_states[-1]` of `generate(output_hidden_states=True)`.

The prompt's bookkeeping (rope positions, audio chunk tables, where the audio goes) is
computed on the CPU, where the prompt already is: on a GPU the prefill then runs without a
single host synchronisation. The prefill and decode steps use either transformers'
DynamicCache or, on the fast path, a `ThinkerStaticStep` (a static KV cache; on CUDA the
prefill and the step are replayed from CUDA graphs).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import DynamicCache
from transformers.models.qwen2_5_omni import modeling_qwen2_5_omni as omni

from .cuda_graphs import CapturedStep
from .phases import PhaseClock
from .prompt import Prompt
from .static_cache import StaticKVCache, StaticPrefill, forward_with_static_cache


ENCODER_ATTENTION = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


@dataclass
class ThinkerOutput:
    embeds: torch.Tensor   # (1, n, H) input embeddings of the fed tokens
    hidden: torch.Tensor   # (1, n, H) final hidden states of the fed tokens
    logits: torch.Tensor   # (1, vocab) next-token logits after the last fed token


class ThinkerStaticStep:
    """The thinker on a preallocated KV cache, for one generation at a time: its prefill
    (`StaticPrefill`) and one decode step, on CUDA one captured graph per attention window.
    The step's outputs are static tensors, valid until the next step."""

    def __init__(self, thinker, capacity: int, device: torch.device, cuda_graphs: bool) -> None:
        self.thinker = thinker
        dtype = thinker.lm_head.weight.dtype
        self.cache = StaticKVCache(thinker.config.text_config, capacity, device, dtype)
        self.prefill = StaticPrefill(thinker.model, self.cache, thinker.config.text_config.hidden_size,
                                     dtype, device, cuda_graphs)
        self.token = torch.zeros((1, 1), dtype=torch.long, device=device)
        self.position = torch.zeros((3, 1, 1), dtype=torch.long, device=device)
        self.graphs = {window: CapturedStep(partial(self._run, window))
                       for window in self.cache.windows} if cuda_graphs else {}

    def __call__(self, token: int, slot: int, position: int) -> ThinkerOutput:
        """Feed `token` into KV slot `slot` at rope position `position`."""
        self.token.fill_(token)
        self.position.fill_(position)
        self.cache.write_at.fill_(slot)
        window = self.cache.window_for(slot + 1)
        graph = self.graphs.get(window)
        return ThinkerOutput(*(graph.replay() if graph is not None else self._run(window)))

    def _run(self, window: int):
        self.cache.window = window
        embeds = self.thinker.get_input_embeddings()(self.token)
        hidden = forward_with_static_cache(self.thinker.model, self.cache, embeds, self.position,
                                           start=None)
        return embeds, hidden, self.thinker.lm_head(hidden[:, -1])


class ThinkerRunner:
    def __init__(self, thinker, device: torch.device, static: ThinkerStaticStep | None = None,
                 clock: PhaseClock | None = None) -> None:
        self.thinker = thinker
        self.device = device
        self.static = static
        self.clock = clock or PhaseClock(device)
        self.cache = None if static is not None else DynamicCache(config=thinker.config.text_config)
        self.rope_delta = 0
        self.length = 0  # tokens in the KV cache

    def prefill(self, prompt: Prompt) -> ThinkerOutput:
        """Run the whole prompt. Embeddings at audio positions are zeroed in the output, as
        `Qwen2_5OmniForConditionalGeneration.generate` does before handing them to the talker."""
        input_ids = prompt.input_ids  # on the CPU
        embeds = self.thinker.get_input_embeddings()(input_ids.to(self.device))
        talker_embeds = embeds
        audio_lengths = None
        if prompt.input_features is not None:
            audio_lengths = prompt.feature_attention_mask.sum(dim=1)
            features = encode_audio(self.thinker.audio_tower, prompt.input_features,
                                    prompt.feature_attention_mask, self.device, embeds.dtype)
            where = (input_ids[0] == self.thinker.config.audio_token_id).nonzero().squeeze(1)
            if where.numel() != features.shape[0]:
                raise ValueError(f"{where.numel()} audio tokens in the prompt but "
                                 f"{features.shape[0]} audio encoder outputs")
            where = where.to(self.device)
            # = masked_scatter / masked_fill over the audio positions, without their host sync
            talker_embeds = embeds.index_fill(1, where, 0.0)
            embeds = embeds.index_copy(1, where, features[None].to(embeds.dtype))
            self.clock.mark("audio_encoded")
        positions, deltas = self.thinker.get_rope_index(
            input_ids, None, None, torch.ones_like(input_ids), False, audio_lengths, None)
        self.rope_delta = int(deltas.reshape(-1)[0])
        positions = positions.to(self.device)
        if self.static is not None:
            hidden = self.static.prefill(embeds, positions)
            self.length = embeds.shape[1]
        else:
            hidden = self._forward(embeds, positions)
        return ThinkerOutput(talker_embeds, hidden, self.thinker.lm_head(hidden[:, -1]))

    def step(self, token_ids: list[int]) -> ThinkerOutput:
        """Feed one (or a few teacher-forced) tokens after the prompt. With a static step the
        output tensors are only valid until the next step."""
        start = self.length + self.rope_delta
        if self.static is not None and len(token_ids) == 1:
            out = self.static(token_ids[0], self.length, start)
            self.length += 1
            return out
        ids = torch.tensor([token_ids], dtype=torch.long, device=self.device)
        embeds = self.thinker.get_input_embeddings()(ids)
        positions = torch.arange(start, start + len(token_ids), device=self.device)
        hidden = self._forward(embeds, positions.view(1, 1, -1).expand(3, 1, -1))
        return ThinkerOutput(embeds, hidden, self.thinker.lm_head(hidden[:, -1]))

    def embed(self, token_id: int) -> torch.Tensor:
        """(1, 1, H) input embedding of a token (the talker's text bos/eos/pad come from here)."""
        ids = torch.tensor([[token_id]], dtype=torch.long, device=self.device)
        return self.thinker.get_input_embeddings()(ids)

    def _forward(self, embeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        if self.static is not None:
            hidden = forward_with_static_cache(self.thinker.model, self.static.cache, embeds,
                                               positions, start=self.length)
        else:
            hidden = self.thinker.model(
                inputs_embeds=embeds, position_ids=positions, past_key_values=self.cache,
                use_cache=True, return_dict=True).last_hidden_state
        self.length += embeds.shape[1]
        return hidden

    def release(self) -> None:
        self.cache = None
        self.static = None


def encode_audio(audio_tower, features: torch.Tensor, feature_mask: torch.Tensor,
                 device: torch.device, dtype: torch.dtype) -> torch.Tensor:
    """(audio tokens, H): the audio encoder's output for every clip, as `get_audio_features`
    computes it. Its bookkeeping (chunking and padding the mel, index tables) runs here on
    the CPU tensors with transformers' own helpers and is handed to the encoder precomputed;
    `cu_seqlens` stays on the CPU because the (non-flash) encoder attention splits by it on
    the host once per layer. Attention may use any SDPA kernel but cuDNN's, which builds and
    caches an execution plan per shape, and the last audio chunk's length changes with every
    utterance."""
    lengths = feature_mask.sum(dim=1)
    flat = features.permute(0, 2, 1)[feature_mask.bool()].permute(1, 0)
    padded, chunk_lengths = omni.chunk_and_pad_features(flat, lengths, audio_tower.n_window)
    cu_seqlens = omni.get_audio_cu_seqlens(chunk_lengths)
    if "flash" in str(audio_tower.config._attn_implementation):
        cu_seqlens = cu_seqlens.to(device)
    with sdpa_kernel(ENCODER_ATTENTION):
        out = audio_tower(
            feature_lens=lengths, padded_feature=padded.to(device, dtype),
            chunk_lengths=chunk_lengths.to(device),
            valid_indices=omni.get_valid_indices(chunk_lengths).to(device),
            pool_indices=omni.get_pool_indices(lengths).to(device), cu_seqlens=cu_seqlens)
    return out.last_hidden_state
