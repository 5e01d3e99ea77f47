"""Next-token choice: greedy, or sampled with temperature / top-k / top-p."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["SamplingParams", "sample"]


@dataclass(frozen=True, slots=True, kw_only=True)
class SamplingParams:
    temperature: float = 0.0  # 0 means greedy
    top_k: int = 0  # 0 means no limit
    top_p: float = 1.0
    seed: int | None = None

    def __post_init__(self) -> None:
        # type checks first: a str or None must fail here with the field's name, not as a TypeError mid-step
        if not _number(self.temperature) or not 0.0 <= self.temperature <= 100.0:
            raise ValueError(f"temperature must be in [0, 100], got {self.temperature!r}; use 0 for greedy")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            raise ValueError(f"top_k must be an int >= 0, got {self.top_k!r}; 0 disables it")
        if not _number(self.top_p) or not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p!r}; 1.0 disables it")
        if self.seed is not None and (
            isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**63
        ):
            raise ValueError(f"seed must be None or an int in [0, 2**63), got {self.seed!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def _number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def sample(logits: Tensor, params: SamplingParams, generator: torch.Generator | None) -> int:
    """One token id from a ``[vocab]`` row of logits."""
    if params.greedy:
        return int(torch.argmax(logits).item())
    scores = logits.to(torch.float32) / params.temperature
    if params.top_k:
        kth = torch.topk(scores, min(params.top_k, scores.numel())).values[-1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    if params.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, descending=True)
        # keep the smallest prefix whose mass reaches top_p (always at least one token)
        drop = sorted_probs.cumsum(0) - sorted_probs >= params.top_p
        sorted_probs[drop] = 0.0
        probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
    return int(torch.multinomial(probs, 1, generator=generator).item())
