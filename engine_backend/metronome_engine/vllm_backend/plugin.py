"""The vLLM general plugin: registers the sinks + window KV spec and the model that scores it.

vLLM calls ``register`` in every process that builds an engine (entry point
``vllm.general_plugins`` -> ``metronome = metronome_engine.vllm_backend.plugin:register``);
``VLLMEngineCore`` also calls it, so the backend works before the package is installed.
"""

from __future__ import annotations

__all__ = ["SINK_WINDOW_ARCH", "register"]

# the architecture name a windowed backend asks vLLM for (through hf_overrides)
SINK_WINDOW_ARCH = "MetronomeSinkWindowLlamaForCausalLM"

_registered = False


def register() -> None:
    """Idempotent: vLLM may load general plugins more than once per process."""
    global _registered
    if _registered:
        return
    from vllm import ModelRegistry
    from vllm.v1.kv_cache_interface import FullAttentionSpec
    from vllm.v1.kv_cache_spec_registry import KVCacheSpecRegistry

    from .attn_backend import register_backends
    from .kv_spec import SinkWindowManager, SinkWindowSpec

    # vLLM registers its built-in specs only while its registry is empty: let it go first
    KVCacheSpecRegistry._ensure_registered()
    # grouped with full attention: same page layout, only the freeing differs
    KVCacheSpecRegistry.register(SinkWindowSpec, SinkWindowManager, uniform_type_base_spec=FullAttentionSpec)
    register_backends()
    if SINK_WINDOW_ARCH not in ModelRegistry.get_supported_archs():
        ModelRegistry.register_model(SINK_WINDOW_ARCH, "metronome_engine.vllm_backend.model:SinkWindowLlamaForCausalLM")
    _registered = True
