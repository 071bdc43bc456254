"""Mirrors vllm_omni/entrypoints/__init__.py: the package; import AsyncOmni from .async_omni."""
