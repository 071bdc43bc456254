"""joined_layers.py: a decoder layer with q/k/v and gate/up joined computes what transformers'
module computes, on the KV pool, for a prompt chunk and for decode steps after it."""

from __future__ import annotations

import copy

import torch

from inference.engine.reference.models.qwen2_5_omni.joined_layers import is_joined, join_projections
from inference.engine.reference.attention import use_pool_attention
from inference.engine.reference.kv_pool import BatchView, KVPool, forward
from inference.engine.reference.models.qwen2_5_omni.loading import load_model


def test_joined_layers_compute_what_the_modules_do(tmp_path, monkeypatch):
    monkeypatch.setenv("OMNI_CACHE_DIR", str(tmp_path))
    model = load_model("tiny-random", torch.device("cpu"), torch.float32).model
    for text_model in (model.thinker.model, model.talker.model):
        joined = copy.deepcopy(text_model)
        join_projections(joined.layers)
        assert all(is_joined(layer) for layer in joined.layers)
        assert not any(is_joined(layer) for layer in text_model.layers)
        # the separate projections are views into the joined weights: nothing held twice
        attn = joined.layers[0].self_attn
        assert attn.k_proj.weight.data_ptr() == attn.qkv_weight[attn.qkv_sizes[0]:].data_ptr()
        hidden = text_model.config.hidden_size
        states = []
        for model_ in (text_model, joined):
            use_pool_attention(model_.config)
            pool = KVPool(model_.config, slots=2, capacity=64, device=torch.device("cpu"), dtype=torch.float32)
            embeds = torch.randn((1, 9, hidden), generator=torch.Generator().manual_seed(1))
            positions = torch.arange(9).view(1, 1, 9).expand(3, 1, 9)
            chunk = BatchView(pool, 1, 9)
            chunk.point([1], [0])
            out = [forward(model_, chunk, embeds, positions)]
            step = BatchView(pool, 1, 1)
            for position in range(9, 12):  # decode steps reading the chunk's keys from the pool
                step.point([1], [position])
                token = torch.randn((1, 1, hidden), generator=torch.Generator().manual_seed(position))
                out.append(forward(model_, step, token, torch.full((3, 1, 1), position)))
            states.append(torch.cat(out, dim=1))
        torch.testing.assert_close(states[1], states[0], rtol=1e-5, atol=1e-5)
