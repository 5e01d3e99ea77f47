"""Free-running generation: one session samples a long text under a KV policy.

Stop tokens are masked so the text runs its full length (a session that never ends, as
in a real-time model); the seed is the same under every policy, so the texts agree token
for token until the window first slides and the policies' logits part.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Collection, Sequence
from typing import Protocol

import torch

from metronome_engine import KVPolicy, SamplingParams, StepRequest
from metronome_engine.model import LlamaModel
from metronome_engine.sampling import sample

from .perplexity import engine_for_stream

__all__ = ["ChatTokenizer", "free_run"]

_PREFILL_CHUNK = 128


class ChatTokenizer(Protocol):
    """What the evaluation needs of a tokenizer (``metronome_engine.tokenizer.Tokenizer`` has it)."""

    stop_ids: frozenset[int]

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def chat(self, messages: Sequence[dict[str, str]], *, add_generation_prompt: bool = True) -> list[int]: ...


def free_run(
    model: LlamaModel,
    policy: KVPolicy,
    prompt: Sequence[int],
    n_tokens: int,
    *,
    sampling: SamplingParams,
    banned: Collection[int] = (),
    progress: Callable[[int], None] | None = None,
) -> list[int]:
    """``n_tokens`` sampled after ``prompt``, never one of ``banned``."""
    if n_tokens < 1:
        raise ValueError(f"n_tokens must be >= 1, got {n_tokens}")
    if not prompt:
        raise ValueError("the prompt is empty; generation starts from at least one token")
    engine = engine_for_stream(model, policy, len(prompt) + n_tokens, chunk=_PREFILL_CHUNK)
    gen = torch.Generator(device="cpu")
    gen.manual_seed(sampling.seed if sampling.seed is not None else 0)
    ban = torch.tensor(sorted(banned), dtype=torch.int64)
    seq = engine.add_sequence()
    out_tokens: list[int] = []
    try:
        feed = [list(prompt[i : i + _PREFILL_CHUNK]) for i in range(0, len(prompt), _PREFILL_CHUNK)]
        while len(out_tokens) < n_tokens:
            piece = feed.pop(0) if feed else [out_tokens[-1]]
            out = engine.step([StepRequest(seq, piece, sample=False, return_logits=True)])[0]
            if not out.ok or out.logits is None:
                raise RuntimeError(f"generation stalled ({out.stall}); the pool is sized too small")
            if feed:
                continue  # still reading the prompt
            logits = out.logits.float()
            if ban.numel():
                logits = logits.index_fill(0, ban, -math.inf)
            out_tokens.append(sample(logits, sampling, gen))
            if progress is not None:
                progress(1)
    finally:
        engine.free_sequence(seq)
    return out_tokens
