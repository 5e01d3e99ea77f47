"""A slowed backend: the tiny model behind ``EngineBackend``, with a step that costs time per token.

It stands for a slow machine (the issue's AVX2 CPU prefilled 8-12 tokens a second) without
a monkeypatch: the engine serves it as it would any backend. Sleeps are lower bounds, so a
loaded test machine makes it slower, never faster.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from metronome_engine import EngineCore, KVPolicy, ModelConfig, PoolStats, SamplingParams, StepOutput, StepRequest
from tests.engine.tiny import tiny_engine


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
        time.sleep(self.fixed + self.per_token * tokens)
        return self.inner.step(requests)

    def pool_stats(self) -> PoolStats:
        return self.inner.pool_stats()

    def session_bound_blocks(self, chunk: int = 1) -> int | None:
        return self.inner.session_bound_blocks(chunk=chunk)
