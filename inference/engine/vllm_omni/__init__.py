"""The `vllm-omni` engine (GPU): vllm-omni's AsyncOmni behind our OmniEngine interface.

Importing this package needs neither vllm nor vllm-omni; `VllmOmniEngine.start()` imports
them and says which extra to install when they are missing.
"""

from .engine import VllmOmniEngine

__all__ = ["VllmOmniEngine"]
