"""A slowed backend: the tiny model behind ``EngineBackend``, with a step that costs time per token.

It stands for a slow machine (the issue's AVX2 CPU prefilled 8-12 tokens a second) without
a monkeypatch: the engine serves it as it would any backend. The extra time is spent working
(small matrix products, the GIL released, as a real step's), not asleep: the watchdog tells a
working step from a blocked one by its thread's CPU time. The time is a lower bound, so a
loaded test machine makes a step slower, never faster.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch

from metronome_engine import EngineCore, KVPolicy, ModelConfig, PoolStats, SamplingParams, StepOutput, StepRequest
from tests.engine.tiny import tiny_engine

_A = torch.ones(32, 32)


def busy(seconds: float) -> None:
    """Work (not sleep) for ``seconds`` of wall time."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        _A @ _A


class SlowedBackend:
    """``EngineCore`` on the tiny model; each step first sleeps ``fixed + per_token * tokens`` seconds."""

    def __init__(
        self, policy: KVPolicy, *, fixed: float, per_token: float, num_blocks: int = 512, block_size: int = 4
    ) -> None:
        self.inner: EngineCore = tiny_engine(policy, num_blocks=num_blocks, block_size=block_size, kernels="torch")
        self.fixed = fixed
        self.per_token = per_token
        self.steps: list[int] = []  # tokens of every step served, calibration included

    @property
    def pins_prefixes(self) -> bool:
        return False  # its session_bound_blocks takes no pinned=

    @property
    def policy(self) -> KVPolicy:
        return self.inner.policy

    @property
    def config(self) -> ModelConfig:
        return self.inner.config

    def add_sequence(self, *, sampling: SamplingParams | None = None) -> int:
        return self.inner.add_sequence(sampling=sampling)

    def free_sequence(self, seq_id: int) -> None:
        self.inner.free_sequence(seq_id)

    def step(self, requests: Sequence[StepRequest]) -> list[StepOutput]:
        tokens = sum(len(r.tokens) for r in requests)
        self.steps.append(tokens)
        busy(self.fixed + self.per_token * tokens)
        return self.inner.step(requests)

    def pool_stats(self) -> PoolStats:
        return self.inner.pool_stats()

    # marks and rewinds (Session.mark / rewind / keep), as the core serves them
    @property
    def rewinds(self) -> bool:
        return True

    def hold_blocks(self, limit: int) -> int:
        return self.inner.hold_blocks(limit)

    def hold(self, seq_id: int, tokens: int) -> None:
        self.inner.hold(seq_id, tokens)

    def release_hold(self, seq_id: int) -> None:
        self.inner.release_hold(seq_id)

    def rewind(self, seq_id: int, num_tokens: int) -> int:
        return self.inner.rewind(seq_id, num_tokens)

    def session_bound_blocks(self, chunk: int = 1) -> int | None:
        return self.inner.session_bound_blocks(chunk=chunk)
