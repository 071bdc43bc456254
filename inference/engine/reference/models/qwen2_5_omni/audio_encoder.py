"""Qwen2.5-Omni's audio encoder: as one batch of fixed-size chunks, replayed from CUDA graphs
(`ChunkedAudioEncoder`), and transformers' module as it is (`encode_audio`).

transformers' encoder (`Qwen2_5OmniAudioEncoder`) cuts a clip's mel into chunks of
2 × n_window frames (2 s) and lets each chunk attend only to itself. Without flash attention
it runs one SDPA call per chunk per layer on the chunks' rows laid end to end, so a clip
costs hundreds of small kernels launched from Python: on a busy GPU the engine loop spent
much of its host time per new clip there, and every reply's decode step waited behind it.

Here every chunk is padded to the full 2 × n_window frames and all of a clip's chunks run as
one batch; attention masks each chunk's padding keys, so every real row sees exactly the keys
it sees in transformers' encoder (same weights, same operations, in another order of
batching). The shapes then depend only on the number of chunks, and a graph per chunk-count
bucket (1, 2, 4, … chunks) replays the whole encoder with one launch. A clip longer than the
largest bucket runs the same code eagerly.

The stride-2 average pooling at the end pairs rows within a chunk: a full chunk has an even
number of rows (n_window), so this equals transformers' pooling over the clip's rows end to
end; `supports` refuses a configuration where it would not.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers.models.qwen2_5_omni import modeling_qwen2_5_omni as omni

from ...cuda_graphs import batch_buckets, bucket_for, capture_each

# any SDPA kernel but cuDNN's, which builds and caches an execution plan per shape (the last
# chunk's length changes with every utterance); the masked batch takes the memory-efficient one
ATTENTION = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]

# graphs are captured for up to this many chunks (2 s each): a 32 s clip; longer ones run eagerly
GRAPH_CHUNKS = 16


class ChunkedAudioEncoder:
    """`audio_tower` (a `Qwen2_5OmniAudioEncoder`) over a clip's log-mel features, its chunks
    batched; with a `capture_stream`, from a graph per chunk-count bucket in `pool`."""

    def __init__(self, audio_tower, device: torch.device, dtype: torch.dtype,
                 capture_stream: torch.cuda.Stream | None, pool=None) -> None:
        self.tower = audio_tower
        self.device = device
        self.dtype = dtype
        self.frames = 2 * audio_tower.n_window  # mel frames per chunk
        self.rows = (self.frames - 1) // 2 + 1  # rows per chunk after the stride-2 convolution
        mel = audio_tower.num_mel_bins
        self.buckets = batch_buckets(GRAPH_CHUNKS)
        # static inputs per bucket: the chunks' features and which of their frames are real
        self.inputs = {chunks: (torch.zeros((chunks, mel, self.frames), dtype=dtype, device=device),
                                torch.ones((chunks, 1, self.frames), dtype=dtype, device=device))
                       for chunks in self.buckets} if capture_stream is not None else {}
        self.graphs = capture_each(self._run, [(chunks,) for chunks in self.buckets], capture_stream,
                                   pool, "audio encoder") if capture_stream is not None else {}

    @staticmethod
    def supports(audio_tower) -> bool:
        """Whether chunk-wise pooling equals the encoder's (an even row count per chunk)."""
        return audio_tower.n_window % 2 == 0

    def __call__(self, features: torch.Tensor, frames: int) -> torch.Tensor:
        """(audio tokens, output_dim) for one clip: `features` (mel, ≥ frames) on the host,
        of which the first `frames` are the clip's."""
        chunks = -(-frames // self.frames)
        padded = torch.zeros((chunks * self.frames, features.shape[0]), dtype=features.dtype)
        padded[:frames] = features[:, :frames].T
        padded = padded.view(chunks, self.frames, -1).transpose(1, 2)
        real = torch.from_numpy((np.arange(chunks * self.frames) < frames).reshape(chunks, 1, self.frames))
        last_rows = (frames - (chunks - 1) * self.frames - 1) // 2 + 1
        tokens = (chunks - 1) * (self.rows // 2) + last_rows // 2  # the pooled pairs
        bucket = bucket_for(chunks, self.buckets)
        graph = self.graphs.get((bucket,)) if bucket is not None else None
        if graph is None:
            out = self._forward(padded.to(self.dtype).to(self.device, non_blocking=True),
                                real.to(self.dtype).to(self.device, non_blocking=True))
            return out.reshape(-1, out.shape[-1])[:tokens]
        buffer, mask = self.inputs[bucket]
        # copied without waiting for the device (a host wait here would drain the loop's stream)
        buffer[:chunks].copy_(padded.to(self.dtype), non_blocking=True)
        buffer[chunks:].zero_()
        mask[:chunks].copy_(real.to(self.dtype), non_blocking=True)
        mask[chunks:].fill_(1)  # unused chunks: zeros, all real (no row without a key)
        out = graph.replay()
        return out.reshape(-1, out.shape[-1])[:tokens].clone()

    def _run(self, chunks: int) -> torch.Tensor:
        buffer, mask = self.inputs[chunks]
        return self._forward(buffer, mask)

    def _forward(self, features: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        """(chunks, n_window // 2 pooled rows, output_dim) from `features` (chunks, mel,
        frames) and `real` (chunks, 1, frames): 1 where a frame is the clip's."""
        tower = self.tower
        hidden = F.gelu(tower.conv1(features)) * real
        hidden = F.gelu(tower.conv2(hidden)).transpose(1, 2)  # (chunks, rows, d_model)
        hidden = hidden + tower.positional_embedding.positional_embedding[:hidden.shape[1]].to(hidden.dtype)
        # a row is real where the frame it starts at is (stride 2): only those are keys
        keys = real[:, :, ::2].bool()[:, None]  # (chunks, 1, 1, rows)
        with sdpa_kernel(ATTENTION):
            for layer in tower.layers:
                hidden = hidden + _attention(layer.self_attn, layer.self_attn_layer_norm(hidden), keys)
                feed = layer.fc2(layer.activation_fn(layer.fc1(layer.final_layer_norm(hidden))))
                hidden = hidden + feed
                if hidden.dtype == torch.float16:  # as transformers' layer does in float16
                    limit = torch.finfo(hidden.dtype).max - 1000
                    hidden = hidden.clamp(-limit, limit)
        pooled = (hidden[:, 0::2] + hidden[:, 1::2]) / 2
        return tower.proj(tower.ln_post(pooled))


def _attention(attention, hidden: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
    """`Qwen2_5OmniAudioAttention` over a batch of chunks (chunks, rows, d_model), each row
    attending to its chunk's real rows."""
    chunks, rows, width = hidden.shape
    heads = attention.num_heads

    def split(projection):
        return projection(hidden).view(chunks, rows, heads, -1).transpose(1, 2)

    out = F.scaled_dot_product_attention(split(attention.q_proj), split(attention.k_proj),
                                         split(attention.v_proj), attn_mask=keys,
                                         scale=attention.scaling)
    return attention.out_proj(out.transpose(1, 2).reshape(chunks, rows, width))


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
    with sdpa_kernel(ATTENTION):
        out = audio_tower(
            feature_lens=lengths, padded_feature=padded.to(device, dtype),
            chunk_lengths=chunk_lengths.to(device),
            valid_indices=omni.get_valid_indices(chunk_lengths).to(device),
            pool_indices=omni.get_pool_indices(lengths).to(device), cu_seqlens=cu_seqlens)
    return out.last_hidden_state
