"""The `reference` engine: omni models with transformers' classes, batched and streamed.

The top level names no model family (docs/reference-engine.md has the picture):
- `engine` — the asyncio face: prepares a request, queues its `Reply`, yields its deltas;
- `core` — the engine loop: one thread owns the device and runs every reply step by step;
- `scheduler` — what runs each step (admission, prefill budget, decode batches, the audio
  policy) and `SlotTable`, who holds which KV slot (prefix caches included);
- `reply` — one reply's state and what it does with each result (the loop alone writes it);
- `models/` — the families behind one contract (`models/base.py`): each family's folder has
  its loading, runner, audio decoding, tiny model and options;
- what every family's runner is built from: `device_runner` (streams, the step's one read),
  `text_steps` (prompt chunks and the thinker's decode step on the pool), `kv_pool` and
  `attention` (the pooled KV cache), `encoder_cache`, `cuda_graphs`, `compiled`,
  `host_copy`, `int8_matmul` (a weight-only kernel), `pending_audio`;
- `prompt` + `chat_template` (request → tokens and content keys), `sampling`, `detokenize`,
  `constrained` (grammar-forced tool calls), `phases` (per-reply phase timings), `loading`
  and `tiny_models` (what every family's loader and tiny model share).
"""

from .engine import ReferenceEngine

__all__ = ["ReferenceEngine"]
