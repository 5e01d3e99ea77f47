"""The interface the SDK drives: what the torch runner and the vLLM backend both provide.

``metronome_sdk.Engine(core=...)`` accepts any object with these members. The torch
runner (``EngineCore``) and the vLLM backend (``metronome_engine.vllm_backend``) are the
two implementations; capacity is a value (``StepOutput.stall``), never an exception.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from .kv_policy import KVPolicy

if TYPE_CHECKING:
    from torch import Tensor

    from .config import ModelConfig
    from .sampling import SamplingParams

__all__ = ["EngineBackend", "PassThroughBackend", "PoolStats", "Stall", "StepOutput", "StepRequest", "validate_step"]


class Stall(enum.Enum):
    """Why a session got no output from a step."""

    POOL_EXHAUSTED = "pool_exhausted"
    # non-finite logits in the session's rows: its KV is corrupt, so the engine dropped it
    NUMERIC_FAULT = "numeric_fault"
    # the session reached the longest stream the backend can hold (vLLM's max_model_len)
    CONTEXT_LIMIT = "context_limit"


@dataclass(frozen=True, slots=True)
class StepRequest:
    """Append ``tokens`` to session ``seq_id``; sample the next token unless ``sample=False``.

    ``all_logits`` returns the logits of every new token (for scoring text);
    ``return_logits`` returns the last token's logits.
    """

    seq_id: int
    tokens: Sequence[int]
    sample: bool = True
    return_logits: bool = False
    all_logits: bool = False


@dataclass(frozen=True, slots=True)
class StepOutput:
    seq_id: int
    token: int | None = None
    logits: Tensor | None = None  # [vocab], or [n_new, vocab] with all_logits
    stall: Stall | None = None
    num_tokens: int = 0  # tokens appended so far (stream length)
    num_blocks: int = 0  # blocks the session holds after the step

    @property
    def ok(self) -> bool:
        return self.stall is None


@dataclass(frozen=True, slots=True)
class PoolStats:
    num_blocks: int
    used_blocks: int
    block_size: int
    sequences: int

    @property
    def occupancy(self) -> float:
        return self.used_blocks / self.num_blocks


@runtime_checkable
class EngineBackend(Protocol):
    """Sessions' KV state in one bounded pool, served one batched step at a time.

    ``pins_prefixes``: whether the backend keeps a session's first tokens (its system prompt)
    resident beside the sinks whatever the window does; where it does, ``add_sequence`` and
    ``session_bound_blocks`` also take ``pinned=`` (a token count), as ``EngineCore``'s do.
    Where it does not, the SDK lets the prompt slide with the window and says so.

    Optional: a backend whose ``rewinds`` is true can take tentative tokens back exactly
    (``Session(rewind_tokens=...)``, ``Session.rewind``): it has ``hold(seq_id, limit)``,
    ``release_hold(seq_id)``, ``rewind(seq_id, length) -> blocks`` and ``hold_blocks(limit)``,
    as ``EngineCore`` does. A backend without ``rewinds`` refuses such sessions at open.
    """

    @property
    def pins_prefixes(self) -> bool: ...

    @property
    def policy(self) -> KVPolicy: ...

    @property
    def config(self) -> ModelConfig: ...

    def add_sequence(self, *, sampling: SamplingParams | None = None) -> int: ...

    def free_sequence(self, seq_id: int) -> None: ...

    def step(self, requests: Sequence[StepRequest]) -> list[StepOutput]: ...

    def pool_stats(self) -> PoolStats: ...

    def session_bound_blocks(self, chunk: int = 1) -> int | None: ...


class PassThroughBackend:
    """An ``EngineBackend`` that hands every call to the one it wraps (``core``): the base of a
    wrapper that changes a few calls, as the benchmark's ``SilentBackend`` changes ``step``."""

    def __init__(self, core: EngineBackend) -> None:
        self.core = core

    @property
    def pins_prefixes(self) -> bool:
        return False  # its add_sequence and session_bound_blocks take no pinned=

    @property
    def policy(self) -> KVPolicy:
        return self.core.policy

    @property
    def config(self) -> ModelConfig:
        return self.core.config

    def add_sequence(self, *, sampling: SamplingParams | None = None) -> int:
        return self.core.add_sequence(sampling=sampling)

    def free_sequence(self, seq_id: int) -> None:
        self.core.free_sequence(seq_id)

    def step(self, requests: Sequence[StepRequest]) -> list[StepOutput]:
        return self.core.step(requests)

    def pool_stats(self) -> PoolStats:
        return self.core.pool_stats()

    def session_bound_blocks(self, chunk: int = 1) -> int | None:
        return self.core.session_bound_blocks(chunk)


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
