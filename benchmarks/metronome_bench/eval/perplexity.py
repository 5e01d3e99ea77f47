"""Streaming perplexity: a text fed through the engine's cache under a KV policy.

Each token is scored from the cache as it stands when the token arrives, exactly as
a session would see it. Chunks are a speed-up only: the engine masks each token of a
chunk to its own span, so any chunk size gives the same numbers as token by token.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from metronome_engine import EngineCore, KVPolicy, StepRequest
from metronome_engine.model import LlamaModel

__all__ = ["PerplexityResult", "engine_for_stream", "streaming_nll", "perplexity"]


@dataclass(frozen=True, slots=True)
class PerplexityResult:
    ppl: float
    tokens: int  # tokens scored
    nll: list[float]  # per scored token, natural log

    def ppl_by_slice(self, slices: int) -> list[float]:
        """Perplexity over ``slices`` equal consecutive parts of the stream."""
        size = max(1, len(self.nll) // slices)
        return [perplexity(self.nll[i * size : (i + 1) * size]) for i in range(slices)]


def perplexity(nll: Sequence[float]) -> float:
    if not nll:
        raise ValueError("no tokens were scored; give a text of at least two tokens")
    return math.exp(sum(nll) / len(nll))


def engine_for_stream(
    model: LlamaModel, policy: KVPolicy, n_tokens: int, *, chunk: int, block_size: int = 16
) -> EngineCore:
    """An engine whose pool holds one stream of ``n_tokens`` under ``policy``."""
    bound = policy.max_blocks(block_size, chunk=chunk)
    blocks = bound if bound is not None else math.ceil(n_tokens / block_size) + 1
    return EngineCore(model, policy=policy, num_blocks=blocks, block_size=block_size)


def streaming_nll(
    engine: EngineCore, tokens: Sequence[int], *, chunk: int = 64, progress: Callable[[int], None] | None = None
) -> PerplexityResult:
    """Score ``tokens[1:]`` one stream through ``engine``; ``progress(n)`` after each chunk."""
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    if len(tokens) < 2:
        raise ValueError(f"the text has {len(tokens)} token(s); perplexity needs at least two")
    seq = engine.add_sequence()
    nll: list[float] = []
    try:
        for start in range(0, len(tokens) - 1, chunk):
            piece = list(tokens[start : min(start + chunk, len(tokens) - 1)])
            out = engine.step([StepRequest(seq, piece, sample=False, all_logits=True)])[0]
            if not out.ok or out.logits is None:
                raise RuntimeError(f"the engine stalled at token {start} ({out.stall}); the pool is too small")
            targets = torch.tensor(tokens[start + 1 : start + 1 + len(piece)], device=out.logits.device)
            logp = torch.log_softmax(out.logits.float(), dim=-1)
            nll.extend((-logp.gather(1, targets[:, None])[:, 0]).tolist())
            if progress is not None:
                progress(len(piece))
    finally:
        engine.free_sequence(seq)
    return PerplexityResult(ppl=perplexity(nll), tokens=len(nll), nll=nll)
