"""The in-process engine: bounded KV (window + pinned sinks) over a fixed block pool.

Sync and torch-only; the SDK drives it from a worker thread. ``EngineBackend`` is the
interface it drives (with its value types ``StepRequest``, ``StepOutput``, ``Stall``,
``PoolStats``, all in ``backend.py``); ``metronome_engine.vllm_backend`` implements it on
vLLM. The interface, ``BlockPool``, ``KVPolicy`` and ``SequenceKV`` need no torch.
"""

from typing import TYPE_CHECKING

from .backend import EngineBackend, PoolStats, Stall, StepOutput, StepRequest
from .block_pool import BlockPool
from .kv_policy import KVPolicy
from .sequence import SequenceKV

if TYPE_CHECKING:
    from .config import ModelConfig
    from .engine import EngineCore
    from .sampling import SamplingParams

__all__ = [
    "BlockPool",
    "EngineBackend",
    "EngineCore",
    "KVPolicy",
    "ModelConfig",
    "PoolStats",
    "SamplingParams",
    "SequenceKV",
    "Stall",
    "StepOutput",
    "StepRequest",
]


def __getattr__(name: str) -> object:
    # torch-backed names load on first use, so the pool and the policy import without torch
    if name == "EngineCore":
        from .engine import EngineCore

        return EngineCore
    if name == "SamplingParams":
        from .sampling import SamplingParams

        return SamplingParams
    if name == "ModelConfig":
        from .config import ModelConfig

        return ModelConfig
    raise AttributeError(f"module 'metronome_engine' has no attribute {name!r}")
