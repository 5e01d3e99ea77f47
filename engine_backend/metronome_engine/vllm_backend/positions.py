"""Which stream tokens a query sees under window + sinks, and where sinks score it (no vLLM).

Keys are stored rotated at their stream index. A window key is scored with the query
rotated at its stream index (their distance is the true distance); a sink key is scored
with the query rotated at its *in-cache* position, the StreamingLLM position of the query
when the resident tokens sit at ``0..S+W-1``. The torch runner scores the same way
(``attention.py``), so both backends produce the same numbers.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["in_cache_positions", "gap_blocks", "visible"]


def in_cache_positions(positions: Tensor, *, window: int, sinks: int) -> Tensor:
    """In-cache position of each query at stream index ``positions``: sinks seen + window seen - 1."""
    n_sink = torch.clamp(positions + 1, max=sinks)
    lo = torch.clamp(positions - window + 1, min=sinks)
    return n_sink + torch.clamp(positions - lo + 1, min=0) - 1


def visible(q_pos: Tensor, k_pos: Tensor, *, window: int, sinks: int) -> Tensor:
    """``[Q, K]`` bool: query at stream index ``q_pos[i]`` attends to key ``k_pos[j]``."""
    q = q_pos.view(-1, 1)
    k = k_pos.view(1, -1)
    lo = torch.clamp(q - window + 1, min=sinks)
    return (k <= q) & ((k < sinks) | (k >= lo))


def gap_blocks(num_computed: int, *, window: int, sinks: int, block_size: int) -> range:
    """Logical blocks no later query can see once ``num_computed`` tokens are in the cache.

    The next query (stream index ``num_computed``) sees sinks ``[0, S)`` and its window from
    ``max(S, num_computed - W + 1)``; blocks wholly between the two are free to go.
    """
    window_start = max(sinks, num_computed - window + 1)
    first = -(-sinks // block_size)  # the block holding the last sink stays
    return range(first, max(first, window_start // block_size))
