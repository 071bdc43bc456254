"""Qwen2.5-Omni's decoder layers with q/k/v as one matrix product and gate/up as one.

A decode step reads every weight of every layer once, for 1 to 32 rows, so it is bound by how
fast the products stream their weights, and a few large products stream faster than many
small ones: a layer's products as four (qkv, o, gate_up, down) take about a tenth less than
as transformers calls them (q, k, v, o, gate, up, down), for the thinker and the talker alike
(`bench/decode_gemm.py`; the figures in bench/results/JOURNAL.md). Serving engines load the weights joined for
this reason; transformers' modules call the projections one by one, so the engine runs the
layer's arithmetic itself once `join_projections` has joined them:

    x = input_layernorm(h);  q, k, v = split(x @ W_qkv + b_qkv);  rotary(q, k)
    h = h + o_proj(attention(q, pool ∪ k, pool ∪ v))
    x = post_attention_layernorm(h);  gate, up = split(x @ W_gate_up)
    h = h + down_proj(act(gate) * up)

which is what `Qwen2_5OmniDecoderLayer.forward` computes (tests/inference/engine: the same
states as the module's, and the engine's replies the same as transformers' `generate`). The
separate projections keep their parameters as views into the joined ones, so transformers' own
forward still works on the same model and no weight is held twice.
"""

from __future__ import annotations

import torch
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.models.qwen2_5_omni.modeling_qwen2_5_omni import apply_rotary_pos_emb

from ...int8_matmul import product


@torch.no_grad()
def join_projections(layers) -> None:
    """Join each decoder layer's q/k/v and gate/up weights (in place; idempotent)."""
    for layer in layers:
        if is_joined(layer):
            continue
        attn, mlp = layer.self_attn, layer.mlp
        if mlp.gate_proj.bias is not None:  # Qwen2's MLP has none; a checkpoint that has them
            raise ValueError("join_projections expects an MLP without biases (Qwen2.5-Omni's)")
        projections = (attn.q_proj, attn.k_proj, attn.v_proj)
        attn.qkv_sizes = [p.out_features for p in projections]
        attn.register_buffer("qkv_weight", _joined(projections, "weight"), persistent=False)
        attn.register_buffer("qkv_bias", _joined(projections, "bias"), persistent=False)
        mlp.register_buffer("gate_up_weight", _joined((mlp.gate_proj, mlp.up_proj), "weight"),
                            persistent=False)


def _joined(modules, name: str) -> torch.Tensor | None:
    """One tensor of the modules' `name` parameters stacked by rows; each module's parameter
    becomes a view into it (the old storage is freed)."""
    parts = [getattr(m, name) for m in modules]
    if any(p is None for p in parts):
        return None
    joined = torch.cat([p.detach() for p in parts])
    start = 0
    for module, part in zip(modules, parts):
        getattr(module, name).data = joined[start:start + part.shape[0]]
        start += part.shape[0]
    return joined


def is_joined(layer) -> bool:
    return hasattr(layer.self_attn, "qkv_weight")


def joined_decoder_layer(layer, hidden: torch.Tensor, view, rotary) -> torch.Tensor:
    """`Qwen2_5OmniDecoderLayer.forward` on the pool with the joined weights: `view` is the
    layer's `LayerView` (its cache and its mask, as kv_pool.decoder_layer passes it). Each
    product goes through `int8_matmul.product` (the int8 weights where a layer has them)."""
    attn, mlp = layer.self_attn, layer.mlp
    batch, length, _ = hidden.shape
    x = layer.input_layernorm(hidden)
    q, k, v = product(x, attn, "qkv", attn.qkv_weight, attn.qkv_bias).split(attn.qkv_sizes, dim=-1)
    q, k, v = [t.view(batch, length, -1, attn.head_dim).transpose(1, 2) for t in (q, k, v)]
    q, k = apply_rotary_pos_emb(q, k, *rotary)
    keys, values = view.update(k, v)
    attention = ALL_ATTENTION_FUNCTIONS[attn.config._attn_implementation]
    out, _ = attention(attn, q, keys, values, view, dropout=0.0, scaling=attn.scaling)
    hidden = hidden + product(out.reshape(batch, length, -1), attn, "o", attn.o_proj.weight,
                              attn.o_proj.bias)
    gate, up = product(layer.post_attention_layernorm(hidden), mlp, "gate_up",
                       mlp.gate_up_weight).chunk(2, dim=-1)
    return hidden + product(mlp.act_fn(gate) * up, mlp, "down", mlp.down_proj.weight)


# The compiled entry points (compiled.py): one per model, so dynamo keeps their code apart.
def thinker_layer(layer, hidden: torch.Tensor, view, rotary) -> torch.Tensor:
    """`joined_decoder_layer` for the thinker's layers."""
    return joined_decoder_layer(layer, hidden, view, rotary)


def talker_layer(layer, hidden: torch.Tensor, view, rotary) -> torch.Tensor:
    """`joined_decoder_layer` for the talker's layers."""
    return joined_decoder_layer(layer, hidden, view, rotary)
