"""Mirrors vllm_omni/entrypoints/utils.py (0.30.0): `coerce_param_message_types`."""

from __future__ import annotations

from .._fake_vllm import RequestOutputKind, SamplingParams


def coerce_param_message_types(params: list, is_streaming: bool):
    """Make every stage's params DELTA (streaming) or FINAL_ONLY, cloning unless skip_clone."""
    target = RequestOutputKind.DELTA if is_streaming else RequestOutputKind.FINAL_ONLY
    for index, sp in enumerate(params):
        if isinstance(sp, SamplingParams) and sp.output_kind != target:
            if not sp.skip_clone:
                sp = sp.clone()
                sp.skip_clone = True
            sp.output_kind = target
            params[index] = sp
    return params
