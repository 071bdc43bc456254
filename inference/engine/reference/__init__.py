"""The `reference` engine: Qwen2.5-Omni with transformers' classes, batched and streamed.

Layout (see docs/reference-engine.md for the picture):
- `engine` — the asyncio face: prepares a request, queues its `Reply`, yields its deltas;
- `core` — the engine loop: one thread owns the device and runs every reply step by step;
- `scheduler` — what runs each step (admission, prefill budget, decode batches, the realtime
  token2wav policy) and `SlotTable`, who holds which KV slot (prefix caches included);
- `runner` — the model execution: KV pools, batched thinker/talker steps, the audio
  encoder cache; `audio_encoder` Qwen2.5-Omni's audio encoder over a clip's chunks as one
  batch; `kv_pool` the pooled KV cache, `host_copy` host values onto the device without waiting,
  `cuda_graphs` the graph capture and the engine's own streams;
- `reply` — one reply's state and what it does with each result;
- `prompt` + `chat_template` (request → tokens and content keys), `sampling`, `detokenize`,
  `constrained` (grammar-forced tool calls), `talker` (codec facts), `token2wav_stream` (one
  reply's chunking) and `token2wav_runner` (the DiT and vocoder, batched), `loading` (weights;
  `tiny` builds the tiny-random model), `phases` (per-reply phase timings).
"""

from .engine import ReferenceEngine

__all__ = ["ReferenceEngine"]
