"""The vLLM general plugin: registers the sinks + window KV spec and the models that score it.

vLLM calls ``register`` in every process that builds an engine (entry point
``vllm.general_plugins`` -> ``metronome = metronome_engine.vllm_backend.plugin:register``);
``VLLMEngineCore`` also calls it, so the backend works before the package is installed.
"""

from __future__ import annotations

__all__ = ["SINK_WINDOW_FAMILIES", "register", "sink_window_arch"]

# vLLM's architecture -> its sinks + window variant in ``model.py`` (vLLM's own class, attention swapped)
SINK_WINDOW_FAMILIES = {
    "LlamaForCausalLM": "SinkWindowLlamaForCausalLM",
    "MistralForCausalLM": "SinkWindowMistralForCausalLM",
    "Qwen2ForCausalLM": "SinkWindowQwen2ForCausalLM",
    "Qwen3ForCausalLM": "SinkWindowQwen3ForCausalLM",
}

_registered = False


def sink_window_arch(arch: str) -> str:
    """The architecture name a windowed backend asks vLLM for (through ``hf_overrides``) for ``arch``."""
    if arch not in SINK_WINDOW_FAMILIES:
        raise ValueError(
            f"architecture {arch!r} has no sinks + window variant in the vLLM backend; "
            f"it serves {sorted(SINK_WINDOW_FAMILIES)} (or use KVPolicy.full())"
        )
    return f"Metronome{SINK_WINDOW_FAMILIES[arch]}"


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
    supported = ModelRegistry.get_supported_archs()
    for arch, cls in SINK_WINDOW_FAMILIES.items():
        name = sink_window_arch(arch)
        if name not in supported:
            ModelRegistry.register_model(name, f"metronome_engine.vllm_backend.model:{cls}")
    _registered = True
