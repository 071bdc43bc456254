"""The `reference` engine: Qwen2.5-Omni with transformers' classes, truly streamed.

Layout: `loading` (checkpoints; `tiny` builds the tiny-random one), `prompt` + `chat_template`
(request → thinker inputs), `thinker` / `talker` / `token2wav_stream` (the three models, one
step at a time), `voice` (talker + token2wav for one reply), `sampling`, `detokenize`,
`tool_calls`, `constrained` (grammar-forced tool calls), `generation` (the per-reply decode
loop) and `engine` (threads, queue, limits).
"""

from .engine import ReferenceEngine

__all__ = ["ReferenceEngine"]
