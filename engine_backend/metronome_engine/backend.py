"""The interface the SDK drives: what the torch runner and the vLLM backend both provide.

``metronome_sdk.Engine(core=...)`` accepts any object with these members. The torch
runner (``EngineCore``) and the vLLM backend (``metronome_engine.vllm_backend``) are the
two implementations; capacity is a value (``StepOutput.stall``), never an exception.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from .kv_policy import KVPolicy

if TYPE_CHECKING:
    from .config import ModelConfig
    from .engine import PoolStats, StepOutput, StepRequest
    from .sampling import SamplingParams

__all__ = ["EngineBackend", "validate_step"]


@runtime_checkable
class EngineBackend(Protocol):
    """Sessions' KV state in one bounded pool, served one batched step at a time."""

    @property
    def policy(self) -> KVPolicy: ...

    @property
    def config(self) -> ModelConfig: ...

    def add_sequence(self, *, sampling: SamplingParams | None = None) -> int: ...

    def free_sequence(self, seq_id: int) -> None: ...

    def step(self, requests: Sequence[StepRequest]) -> list[StepOutput]: ...

    def pool_stats(self) -> PoolStats: ...

    def session_bound_blocks(self, chunk: int = 1) -> int | None: ...


def validate_step(requests: Sequence[StepRequest], vocab_size: int, open_sequence: Callable[[int], object]) -> None:
    """Reject a whole step before anything changes, with the same messages in every backend.

    ``open_sequence(seq_id)`` raises ``ValueError`` for a session that is not open.
    """
    seen: set[int] = set()
    for req in requests:
        open_sequence(req.seq_id)
        if req.seq_id in seen:
            raise ValueError(f"seq_id={req.seq_id} appears twice in one step; merge its tokens into one request")
        seen.add(req.seq_id)
        if len(req.tokens) == 0:
            raise ValueError(f"tokens for seq_id={req.seq_id} is empty; a step appends at least one token")
        for t in req.tokens:
            if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab_size:
                raise ValueError(
                    f"tokens for seq_id={req.seq_id} holds {t!r}, outside the vocabulary [0, {vocab_size}); "
                    "encode text with the model's tokenizer"
                )
