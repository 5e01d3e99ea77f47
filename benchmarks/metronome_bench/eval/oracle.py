"""The re-computation oracle: each token scored from a fresh forward over the W tokens before it.

It is the best any W-token context can do, at a W-token forward per scored token, so it is
run on a subsample of positions. Many windows go through the engine in one batched step
(full policy, positions ``0..W-1`` in each), and only their last logits are computed.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import torch

from metronome_engine import EngineCore, KVPolicy, StepRequest
from metronome_engine.model import LlamaModel

__all__ = ["recompute_nll"]

_TOKENS_PER_BATCH = 4096  # windows per step: 16 of W=256 keeps the step's tensors small


def recompute_nll(
    model: LlamaModel,
    tokens: Sequence[int],
    indices: Sequence[int],
    window: int,
    *,
    progress: Callable[[int], None] | None = None,
) -> list[float]:
    """NLL of ``tokens[i + 1]`` from ``tokens[max(0, i + 1 - window) : i + 1]`` alone, for each ``i``.

    ``i`` is a scored index as in ``streaming_nll`` (index ``i`` predicts token ``i + 1``).
    ``progress(n)`` is called with the number of windows done after each batch.
    """
    if window < 1:
        raise ValueError(f"window must be >= 1, got {window}")
    for i in indices:
        if not 0 <= i < len(tokens) - 1:
            raise ValueError(f"scored index {i} is outside the text of {len(tokens)} tokens")
    block_size = 16
    per_batch = max(1, _TOKENS_PER_BATCH // window)
    blocks = per_batch * (math.ceil(window / block_size) + 1)
    engine = EngineCore(model, policy=KVPolicy.full(), num_blocks=blocks, block_size=block_size)
    nll: list[float] = []
    for at in range(0, len(indices), per_batch):
        batch = list(indices[at : at + per_batch])
        seqs = [engine.add_sequence() for _ in batch]
        try:
            outs = engine.step(
                [
                    StepRequest(s, list(tokens[max(0, i + 1 - window) : i + 1]), sample=False, return_logits=True)
                    for s, i in zip(seqs, batch, strict=True)
                ]
            )
        finally:
            for s in seqs:
                engine.free_sequence(s)
        for out, i in zip(outs, batch, strict=True):
            if not out.ok or out.logits is None:
                raise RuntimeError(f"the oracle's engine stalled ({out.stall}); its pool is sized too small")
            logp = torch.log_softmax(out.logits.float(), dim=-1)
            nll.append(-float(logp[tokens[i + 1]]))
        if progress is not None:
            progress(len(batch))
    return nll
