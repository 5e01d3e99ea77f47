from __future__ import annotations

import itertools
import math

import pytest

from metronome_bench.eval.perplexity import PerplexityResult
from metronome_bench.eval.slicing import oracle_positions, ppl_at, slice_bounds


def test_slices_are_equal_consecutive_and_match_perplexity_result() -> None:
    assert slice_bounds(16384, 16)[8] == (8192, 9216)
    assert slice_bounds(10, 3) == [(0, 3), (3, 6), (6, 9)]  # the remainder is left out
    nll = [float(i % 7) for i in range(100)]
    ours = [math.exp(sum(nll[a:b]) / (b - a)) for a, b in slice_bounds(100, 4)]
    assert ours == pytest.approx(PerplexityResult(1.0, 100, nll).ppl_by_slice(4))


def test_oracle_positions_are_evenly_spaced_inside_each_slice() -> None:
    bounds = slice_bounds(1024, 4)
    pos = oracle_positions(bounds, 4)
    assert pos[0] == [32, 96, 160, 224]  # centres of four 64-token sub-ranges
    for (a, b), p in zip(bounds, pos, strict=True):
        assert all(a <= i < b for i in p)
        assert len({y - x for x, y in itertools.pairwise(p)}) == 1
    assert oracle_positions([(0, 5)], 5) == [[0, 1, 2, 3, 4]]


def test_ppl_at_uses_only_the_given_positions() -> None:
    nll = [0.0, math.log(4.0), 0.0, math.log(4.0)]
    assert ppl_at(nll, [1, 3]) == pytest.approx(4.0)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: slice_bounds(3, 4), "cannot fill"),
        (lambda: slice_bounds(3, 0), "slices must be"),
        (lambda: oracle_positions([(0, 3)], 4), "cannot take"),
        (lambda: oracle_positions([(0, 3)], 0), "per_slice must be"),
    ],
)
def test_bad_input_is_named(call: object, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        call()  # type: ignore[operator]
