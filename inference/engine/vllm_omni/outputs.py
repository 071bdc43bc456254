"""Read what we need out of vllm-omni's `OmniRequestOutput` (0.26, 0.28, 0.30).

0.26's wraps a vLLM RequestOutput and 0.28's is one, but both read the same through
`outputs`, `prompt_token_ids`, `multimodal_output` and `metrics`, which is all this uses.

`AsyncOmni.generate` yields one `OmniRequestOutput` per step of each *final-output* stage:
the thinker (`final_output_type == "text"`) and code2wav (`"audio"`). With
`RequestOutputKind.DELTA` sampling params every output carries only what is new since the
previous one: `outputs[0].text` / `.token_ids` for the thinker, and
`multimodal_output["audio"]` (a tensor, or a list of tensors when several chunks landed
between two outputs) for code2wav, with an optional `"sr"` sample rate (24 kHz when absent).
`metrics["stage_metrics"]` holds each stage's counts and generation time so far.
"""

from __future__ import annotations

from typing import Any

import numpy as np

DEFAULT_AUDIO_SAMPLE_RATE = 24_000


def is_text(output: Any) -> bool:
    return output.final_output_type == "text"


def is_audio(output: Any) -> bool:
    return output.final_output_type == "audio"


def completion(output: Any) -> Any | None:
    """The stage's single completion (`vllm.outputs.CompletionOutput`), if any."""
    return output.outputs[0] if output.outputs else None


def audio_samples(output: Any) -> tuple[np.ndarray, int]:
    """New waveform in this output, float32 mono, and its sample rate."""
    payload = output.multimodal_output or {}
    rate = _sample_rate(payload.get("sr"))
    audio = payload.get("audio")
    if audio is None:
        return np.zeros(0, dtype=np.float32), rate
    chunks = audio if isinstance(audio, (list, tuple)) else [audio]
    return np.concatenate([_to_float32(c) for c in chunks] or [np.zeros(0, np.float32)]), rate


def _stage_metrics(output: Any) -> list[dict]:
    metrics = output.metrics if isinstance(output.metrics, dict) else {}
    return [s for s in metrics.get("stage_metrics", {}).values() if isinstance(s, dict)]


def talker_tokens(output: Any) -> int:
    """Codec tokens the talker produced so far, from the request's per-stage metrics."""
    return sum(int(s.get("num_tokens_out", 0)) for s in _stage_metrics(output) if s.get("stage_name") == "talker")


def stage_seconds(output: Any) -> dict[str, float]:
    """Generation time of each stage so far, by stage name ("thinker", "talker", "code2wav")."""
    return {s["stage_name"]: float(s["stage_gen_time_ms"]) / 1000 for s in _stage_metrics(output)
            if "stage_name" in s and "stage_gen_time_ms" in s}


def _to_float32(chunk: Any) -> np.ndarray:
    if hasattr(chunk, "detach"):  # torch.Tensor
        chunk = chunk.detach().float().cpu().numpy()
    return np.asarray(chunk, dtype=np.float32).reshape(-1)


def _sample_rate(value: Any) -> int:
    if isinstance(value, (list, tuple)):
        value = value[-1] if value else None
    if value is None:
        return DEFAULT_AUDIO_SAMPLE_RATE
    return int(value.item() if hasattr(value, "item") else value)
