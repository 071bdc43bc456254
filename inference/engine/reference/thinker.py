"""The thinker, one step at a time, returning what the talker needs from every token.

Mirrors `Qwen2_5OmniThinkerForConditionalGeneration.forward` for a single, unpadded sequence:
token embeddings with the audio encoder's output scattered into the `<|AUDIO|>` positions,
3D rope positions from the model's own `get_rope_index`, then the text model and `lm_head`.
Positions are computed here and passed in explicitly, so the module's cached `rope_deltas`
(shared state) is never touched and several generations can share one model.

Per fed token the talker needs the token's input embedding and the final (normed) hidden
state, i.e. `hidden_states[0]` and `hidden_states[-1]` of `generate(output_hidden_states=True)`.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache

from .prompt import Prompt


@dataclass
class ThinkerOutput:
    embeds: torch.Tensor   # (1, n, H) input embeddings of the fed tokens
    hidden: torch.Tensor   # (1, n, H) final hidden states of the fed tokens
    logits: torch.Tensor   # (1, vocab) next-token logits after the last fed token


class ThinkerRunner:
    def __init__(self, thinker, device: torch.device) -> None:
        self.thinker = thinker
        self.device = device
        self.cache = DynamicCache(config=thinker.config.text_config)
        self.rope_delta = 0
        self.length = 0  # tokens in the KV cache

    def prefill(self, prompt: Prompt) -> ThinkerOutput:
        """Run the whole prompt. Embeddings at audio positions are zeroed in the output, as
        `Qwen2_5OmniForConditionalGeneration.generate` does before handing them to the talker."""
        input_ids = prompt.input_ids.to(self.device)
        embeds = self.thinker.get_input_embeddings()(input_ids)
        audio_lengths = None
        audio_mask = None
        if prompt.input_features is not None:
            feature_mask = prompt.feature_attention_mask.to(self.device)
            audio_lengths = feature_mask.sum(dim=1)
            features = self.thinker.get_audio_features(
                prompt.input_features.to(self.device, embeds.dtype), feature_mask,
                return_dict=True,
            ).last_hidden_state.to(embeds.dtype)
            _, _, audio_mask = self.thinker.get_placeholder_mask(input_ids, inputs_embeds=embeds)
            embeds = embeds.masked_scatter(audio_mask, features)
        positions, deltas = self.thinker.get_rope_index(
            input_ids, None, None, torch.ones_like(input_ids), False, audio_lengths, None)
        self.rope_delta = int(deltas.reshape(-1)[0])
        hidden = self._forward(embeds, positions)
        talker_embeds = embeds if audio_mask is None else embeds.masked_fill(audio_mask, 0.0)
        return ThinkerOutput(talker_embeds, hidden, self.thinker.lm_head(hidden[:, -1]))

    def step(self, token_ids: list[int]) -> ThinkerOutput:
        """Feed one (or a few teacher-forced) tokens after the prompt."""
        ids = torch.tensor([token_ids], dtype=torch.long, device=self.device)
        embeds = self.thinker.get_input_embeddings()(ids)
        start = self.length + self.rope_delta
        positions = torch.arange(start, start + len(token_ids), device=self.device)
        hidden = self._forward(embeds, positions.view(1, 1, -1).expand(3, 1, -1))
        return ThinkerOutput(embeds, hidden, self.thinker.lm_head(hidden[:, -1]))

    def embed(self, token_id: int) -> torch.Tensor:
        """(1, 1, H) input embedding of a token (the talker's text bos/eos/pad come from here)."""
        ids = torch.tensor([[token_id]], dtype=torch.long, device=self.device)
        return self.thinker.get_input_embeddings()(ids)

    def _forward(self, embeds: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        out = self.thinker.model(
            inputs_embeds=embeds, position_ids=positions, past_key_values=self.cache,
            use_cache=True, return_dict=True)
        self.length += embeds.shape[1]
        return out.last_hidden_state

    def release(self) -> None:
        self.cache = None
