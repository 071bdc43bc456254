"""A small fake of vllm-omni 0.30.0 (the PyPI wheel), for tests on machines without a GPU.

Same import paths, names, signatures and output shapes as the real package, for what our
engine (inference/engine/vllm_omni/) touches:

- `vllm_omni.entrypoints.async_omni.AsyncOmni` (real: vllm_omni/entrypoints/async_omni.py and
  its bases async_omni_base.py, omni_base.py): the constructor, `generate`, `abort`,
  `shutdown`, `default_sampling_params_list`, `num_stages`, `async_chunk`.
- `vllm_omni.entrypoints.utils.coerce_param_message_types` (real: entrypoints/utils.py).
- `vllm_omni.outputs.OmniRequestOutput` (real: outputs/__init__.py) and, in
  `vllm_omni.outputs.mm_outputs`, `MultimodalPayload` / `MultimodalCompletionOutput`.
- `vllm_omni._fake_vllm`: stand-ins for the vLLM 0.30 classes those carry
  (`SamplingParams`, `RequestOutputKind`, `CompletionOutput`), so no vllm is needed. This
  module has no real counterpart.

Instead of a model, `AsyncOmni` plays a `Script` (text pieces, a waveform, usage numbers)
the way a Qwen pipeline of thinker → talker → code2wav would, and records what it was asked.
tests/inference/engine/test_vllm_omni_engine.py compares these signatures with the real package wherever
that is installed.
"""

__version__ = "0.30.0"
