"""Cutting a scored stream into slices, and the evenly spaced positions the oracle scores."""

from __future__ import annotations

from collections.abc import Sequence

from .perplexity import perplexity

__all__ = ["oracle_positions", "ppl_at", "slice_bounds"]


def slice_bounds(n_scored: int, slices: int) -> list[tuple[int, int]]:
    """``slices`` equal consecutive ``[start, stop)`` ranges of ``n_scored`` scored tokens."""
    if slices < 1:
        raise ValueError(f"slices must be >= 1, got {slices}")
    if n_scored < slices:
        raise ValueError(f"{n_scored} scored tokens cannot fill {slices} slices; score more tokens or use fewer slices")
    size = n_scored // slices  # a remainder at the end is left out, as in PerplexityResult.ppl_by_slice
    return [(i * size, (i + 1) * size) for i in range(slices)]


def oracle_positions(bounds: Sequence[tuple[int, int]], per_slice: int) -> list[list[int]]:
    """``per_slice`` evenly spaced scored indices in each slice: the centres of equal sub-ranges."""
    if per_slice < 1:
        raise ValueError(f"per_slice must be >= 1, got {per_slice}")
    out = []
    for start, stop in bounds:
        size = stop - start
        if per_slice > size:
            raise ValueError(f"cannot take {per_slice} positions from a slice of {size} tokens")
        out.append([start + (2 * k + 1) * size // (2 * per_slice) for k in range(per_slice)])
    return out


def ppl_at(nll: Sequence[float], indices: Sequence[int]) -> float:
    """Perplexity over the scored tokens at ``indices`` only."""
    return perplexity([nll[i] for i in indices])
