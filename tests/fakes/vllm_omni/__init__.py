"""A small fake of vllm-omni 0.26.0, 0.28.0 and 0.30.0 (the PyPI wheels), for tests without a GPU.

Which release it plays is read from `FAKE_VLLM_OMNI_VERSION` at import (default 0.30.0);
tests/inference/engine/test_vllm_omni_engine.py runs every engine test against each. Where the releases
differ (see inference/engine/vllm_omni/compat.py) the fake has each one's real signature.

Same import paths, names, signatures and output shapes as the real package, for what our
engine (inference/engine/vllm_omni/) touches:

- `vllm_omni.entrypoints.async_omni.AsyncOmni` (real: vllm_omni/entrypoints/async_omni.py and
  its bases async_omni_base.py, omni_base.py): the constructor, `generate`, `abort`,
  `shutdown`, `default_sampling_params_list`, `num_stages`, `async_chunk`.
- `vllm_omni.entrypoints.utils.coerce_param_message_types` (real: entrypoints/utils.py).
- `vllm_omni.outputs.OmniRequestOutput` (real: outputs/__init__.py) and, in
  `vllm_omni.outputs.mm_outputs`, `MultimodalPayload` / `MultimodalCompletionOutput`.
- `vllm_omni._fake_vllm`: stand-ins for the vLLM classes those carry (`SamplingParams`,
  `RequestOutputKind`, `CompletionOutput`, `RequestOutput`), so no vllm is needed. This
  module has no real counterpart.

Instead of a model, `AsyncOmni` plays a `Script` (text pieces, a waveform, usage numbers)
the way a Qwen pipeline of thinker → talker → code2wav would, and records what it was asked.
The same test file compares the fake of the installed release with the real package wherever
that is installed.
"""

import os

RELEASES = ("0.26.0", "0.28.0", "0.30.0")
__version__ = os.environ.get("FAKE_VLLM_OMNI_VERSION", RELEASES[-1])
if __version__ not in RELEASES:
    raise ImportError(f"the fake vllm_omni plays {', '.join(RELEASES)}, not {__version__}")
RELEASE = tuple(int(part) for part in __version__.split(".")[:2])
