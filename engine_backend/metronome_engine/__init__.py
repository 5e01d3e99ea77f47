"""The in-process engine: bounded KV (window + pinned sinks) over a fixed block pool.

Sync and torch-only; the SDK drives it from a worker thread. ``EngineBackend`` is the
interface it drives; ``metronome_engine.vllm_backend`` implements it on vLLM. ``BlockPool``,
``KVPolicy`` and ``SequenceKV`` need no torch.
"""

from typing import TYPE_CHECKING

from .backend import EngineBackend
from .block_pool import BlockPool
from .kv_policy import KVPolicy
from .sequence import SequenceKV

if TYPE_CHECKING:
    from .config import ModelConfig
    from .engine import EngineCore, PoolStats, Stall, StepOutput, StepRequest
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
    if name in ("EngineCore", "StepRequest", "StepOutput", "Stall", "PoolStats"):
        from . import engine

        return getattr(engine, name)
    if name == "SamplingParams":
        from .sampling import SamplingParams

        return SamplingParams
    if name == "ModelConfig":
        from .config import ModelConfig

        return ModelConfig
    raise AttributeError(f"module 'metronome_engine' has no attribute {name!r}")
