"""A pinned prefix (a system prompt) under the window policy: pure Python, no torch."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from metronome_engine import BlockPool, KVPolicy, SequenceKV


@given(
    window=st.integers(1, 40),
    sinks=st.integers(0, 8),
    pinned=st.integers(0, 60),
    bs=st.sampled_from([1, 4, 16]),
    chunks=st.lists(st.integers(1, 12), min_size=1, max_size=40),
)
def test_pinned_blocks_stay_and_the_bound_holds(
    window: int, sinks: int, pinned: int, bs: int, chunks: list[int]
) -> None:
    policy = KVPolicy.windowed(window, sinks=sinks)
    pool = BlockPool(1000, block_size=bs)
    seq = SequenceKV(1, policy, pool, pinned=pinned)
    p = max(sinks, pinned)
    assert seq.pinned == p
    first: dict[int, int] = {}
    for n in chunks:
        assert seq.reserve(n)
        assert seq.num_blocks <= (policy.max_blocks(bs, chunk=n, pinned=pinned) or 0)
        seq.commit(n)
        assert seq.num_blocks <= math.ceil(p / bs) + math.ceil(window / bs) + 1
        table = dict(seq.resident_blocks())
        # every block holding a pinned token is resident, and stays the same block
        for lb in range(min(math.ceil(p / bs), math.ceil(seq.num_tokens / bs))):
            assert first.setdefault(lb, table[lb]) == table[lb]
        # the last token saw the pinned tokens and its window: what it missed is evicted
        t = seq.num_tokens - 1
        n_pinned, lo = policy.span(t, pinned=pinned)
        assert n_pinned == min(p, t + 1) and lo == max(p, t - window + 1)
        assert seq.evicted_tokens == max(0, lo - p)
        # what the next token will see is resident
        n_pinned, lo = policy.span(t + 1, pinned=pinned)
        for j in [*range(min(n_pinned, t + 1)), *range(lo, t + 1)]:
            assert j // bs in table
    seq.release()
    assert pool.num_used == 0


def test_sinks_combine_with_the_pin_as_the_longer_of_the_two() -> None:
    policy = KVPolicy.windowed(256, sinks=4)
    assert policy.pinned_tokens(0) == 4  # no prompt: the sinks alone
    assert policy.pinned_tokens(2) == 4  # a prompt shorter than the sinks adds nothing
    assert policy.pinned_tokens(300) == 300  # the sinks are the prompt's first tokens
    assert policy.max_blocks(16, pinned=300) == math.ceil(300 / 16) + math.ceil(256 / 16) + 1
    assert policy.max_blocks(16, pinned=0) == policy.max_blocks(16)
    assert policy.evicted(4 + 256, pinned=0) == 0
    assert policy.evicted(4 + 256 + 10, pinned=0) == 10
    assert policy.evicted(300 + 256 + 10, pinned=300) == 10
    full = KVPolicy.full()  # keeps everything: nothing to pin, nothing evicted, no bound
    assert full.pinned_tokens(300) == 0 and full.evicted(10**6, pinned=300) == 0
    assert full.max_blocks(16, pinned=300) is None


@pytest.mark.parametrize("pinned", [-1, 2.5, True, "300"])
def test_a_bad_pin_is_refused_with_its_name(pinned: object) -> None:
    with pytest.raises(ValueError, match="pinned"):
        KVPolicy.windowed(8, sinks=2).pinned_tokens(pinned)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="pinned"):
        SequenceKV(1, KVPolicy.windowed(8), BlockPool(10), pinned=pinned)  # type: ignore[arg-type]
