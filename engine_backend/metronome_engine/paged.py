"""A step's layout for the fused kernels: every session's blocks read in place.

The torch path copies each session's blocks into a contiguous batch view and masks it
(``attention.py``); the fused attention kernel walks each session's block table in the
pool instead, so a step carries only the tables and each query's stream index.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from .attention import SeqChunk, StepTokens
from .kv_policy import KVPolicy

__all__ = ["PagedBatch"]


@dataclass(frozen=True, slots=True)
class PagedBatch:
    tokens: StepTokens
    query_start: Tensor  # [B + 1] first row of each session's new tokens
    block_logical: Tensor  # [B, max_blocks] logical id of each resident block, stream order
    block_physical: Tensor  # [B, max_blocks] its block in the pool
    block_count: Tensor  # [B] resident blocks per session
    block_size: int
    window: int  # 0: every token (full policy)
    sinks: int
    pinned: Tensor | None  # [B] first tokens each session keeps (sinks or a longer prefix); None: ``sinks`` for all

    @classmethod
    def build(cls, policy: KVPolicy, chunks: Sequence[SeqChunk], *, device: torch.device) -> PagedBatch:
        tables = [ch.seq.resident_blocks() for ch in chunks]
        width = max(len(t) for t in tables)
        # flat lists, then one tensor each: a small tensor per session costs more than the lists
        logical = [-1] * (len(chunks) * width)
        physical = [0] * (len(chunks) * width)
        for b, table in enumerate(tables):
            at = b * width
            for i, (lb, pb) in enumerate(table):
                logical[at + i] = lb
                physical[at + i] = pb
        starts = [0]
        for ch in chunks:
            starts.append(starts[-1] + ch.n_new)
        return cls(
            tokens=StepTokens.build(policy, chunks, device=device),
            query_start=torch.tensor(starts, dtype=torch.int64, device=device),
            block_logical=torch.tensor(logical, dtype=torch.int64, device=device).view(len(chunks), width),
            block_physical=torch.tensor(physical, dtype=torch.int64, device=device).view(len(chunks), width),
            block_count=torch.tensor([len(t) for t in tables], dtype=torch.int64, device=device),
            block_size=chunks[0].seq.block_size,
            window=policy.window if policy.window is not None else 0,
            sinks=policy.sinks,  # 0 under the full policy
            pinned=(
                torch.tensor([ch.seq.pinned for ch in chunks], dtype=torch.int64, device=device)
                if any(ch.seq.pinned != policy.sinks for ch in chunks)
                else None
            ),
        )
