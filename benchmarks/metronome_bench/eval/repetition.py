"""Repetition of generated text: repeated n-grams and distinct-n."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

__all__ = ["distinct_n", "repeated_ngram_fraction"]


def _ngrams(units: Sequence[Hashable], n: int) -> list[tuple[Hashable, ...]]:
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    return [tuple(units[i : i + n]) for i in range(len(units) - n + 1)]


def repeated_ngram_fraction(units: Sequence[Hashable], n: int = 4) -> float:
    """Share of the n-grams that repeat an earlier one (0: none repeats; near 1: a loop)."""
    grams = _ngrams(units, n)
    return 1.0 - len(set(grams)) / len(grams) if grams else 0.0


def distinct_n(units: Sequence[Hashable], n: int = 2) -> float:
    """Distinct n-grams over all n-grams (1: all different)."""
    grams = _ngrams(units, n)
    return len(set(grams)) / len(grams) if grams else 0.0
