"""The block pool and a session's block table, without torch or a model."""

from __future__ import annotations

import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from metronome_engine import BlockPool, KVPolicy, SequenceKV


@given(st.integers(1, 64), st.lists(st.tuples(st.booleans(), st.integers(0, 20)), max_size=60))
def test_allocate_free_keep_counts_consistent(num_blocks: int, ops: list[tuple[bool, int]]) -> None:
    pool = BlockPool(num_blocks, block_size=4)
    held: list[int] = []
    for is_alloc, n in ops:
        if is_alloc:
            got = pool.allocate(n)
            if n > num_blocks - len(held):
                assert got is None  # no room is a value, and nothing was taken
            else:
                assert got is not None and len(got) == n
                assert not set(got) & set(held)  # never hands out a block twice
                held.extend(got)
        else:
            back, held = held[:n], held[n:]
            pool.free(back)
        assert pool.num_used == len(held)
        assert pool.num_free == num_blocks - len(held)
        assert pool.occupancy == pytest.approx(len(held) / num_blocks)
        assert all(0 <= b < num_blocks for b in held)
    pool.free(held)
    assert pool.num_used == 0


def test_double_free_and_foreign_blocks_are_refused() -> None:
    pool = BlockPool(4, block_size=4)
    blocks = pool.allocate(2)
    assert blocks is not None
    pool.free(blocks[:1])
    with pytest.raises(ValueError, match="not allocated"):
        pool.free(blocks[:1])
    with pytest.raises(ValueError, match="twice"):
        pool.free([blocks[1], blocks[1]])
    with pytest.raises(ValueError, match="not allocated"):
        pool.free([99])
    assert pool.num_used == 1


def test_pool_sized_from_a_byte_budget() -> None:
    pool = BlockPool.from_budget(10_000, bytes_per_block=3_000, block_size=8)
    assert pool.num_blocks == 3 and pool.block_size == 8
    with pytest.raises(ValueError, match="budget_bytes"):
        BlockPool.from_budget(100, bytes_per_block=3_000)


@pytest.mark.parametrize(("num_blocks", "block_size"), [(0, 16), (-1, 16), (4, 0), (True, 16)])
def test_bad_pool_sizes_name_the_field(num_blocks: int, block_size: int) -> None:
    with pytest.raises(ValueError, match=r"num_blocks|block_size"):
        BlockPool(num_blocks, block_size)


def _stream(seq: SequenceKV, n_tokens: int, chunk: int = 1) -> list[int]:
    """Append ``n_tokens`` as the engine would; the block count after each step."""
    held = []
    done = 0
    while done < n_tokens:
        n = min(chunk, n_tokens - done)
        assert seq.reserve(n)
        seq.commit(n)
        done += n
        held.append(seq.num_blocks)
    return held


@pytest.mark.parametrize(("window", "sinks", "bs"), [(256, 4, 16), (100, 0, 16), (64, 20, 16), (7, 3, 4)])
def test_windowed_session_holds_a_constant_number_of_blocks(window: int, sinks: int, bs: int) -> None:
    policy = KVPolicy.windowed(window, sinks=sinks)
    pool = BlockPool(1000, block_size=bs)
    seq = SequenceKV(1, policy, pool)
    held = _stream(seq, 100_000)
    bound = policy.max_blocks(bs)
    assert bound == math.ceil(sinks / bs) + math.ceil(window / bs) + 1
    steady = held[sinks + window + bs :]  # from token S+W+bs on
    assert max(held) <= bound
    assert max(steady) - min(steady) <= 1  # the window's edge crosses block borders: at most one block of play
    assert max(steady) == max(held[-5 * bs :])  # and it does not creep up over 100,000 tokens
    assert pool.num_used == seq.num_blocks
    seq.release()
    assert pool.num_used == 0


def test_full_session_grows_until_the_pool_says_no() -> None:
    pool = BlockPool(5, block_size=4)
    seq = SequenceKV(1, KVPolicy.full(), pool)
    _stream(seq, 20)
    assert seq.num_blocks == 5 and pool.num_free == 0
    assert not seq.reserve(1)  # no room: a value, and nothing changed
    assert seq.num_tokens == 20 and seq.num_blocks == 5
    seq.release()
    assert pool.num_used == 0


def test_chunked_appends_stay_within_the_chunk_bound_and_rollback_returns_blocks() -> None:
    policy = KVPolicy.windowed(32, sinks=4)
    pool = BlockPool(100, block_size=8)
    seq = SequenceKV(1, policy, pool)
    peak = 0
    for _ in range(200):
        assert seq.reserve(16)
        peak = max(peak, seq.num_blocks)
        seq.commit(16)
    bound = policy.max_blocks(8, chunk=16)
    assert bound is not None and peak <= bound
    before = pool.num_used
    assert seq.reserve(16)
    seq.rollback()  # a step that failed gives back what it reserved
    assert pool.num_used == before


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"window": 0}, "window"),
        ({"window": -5}, "window"),
        ({"window": 8, "sinks": -1}, "sinks"),
        ({"window": 2.5}, "window"),
    ],
)
def test_bad_policy_names_the_field(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        KVPolicy(kind="window", **kwargs)  # type: ignore[arg-type]


def test_block_pool_and_policy_import_without_torch() -> None:
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from metronome_engine import BlockPool, KVPolicy, SequenceKV\n"
        "s = SequenceKV(1, KVPolicy.windowed(8, sinks=2), BlockPool(8, 4)); s.reserve(3); s.commit(3)\n"
        "print(s.num_blocks)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "1"


def test_the_backend_interface_and_its_value_types_import_without_torch() -> None:
    # the vLLM backend and any other implementation take them from backend.py, not from the torch runner
    import subprocess
    import sys

    code = (
        "import sys; sys.modules['torch'] = None\n"
        "from metronome_engine import EngineBackend, PoolStats, Stall, StepOutput, StepRequest\n"
        "out = StepOutput(seq_id=1, stall=Stall.POOL_EXHAUSTED)\n"
        "print(out.ok, StepRequest(1, [5]).tokens, PoolStats(8, 2, 16, 1).occupancy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False [5] 0.25"


@given(
    st.integers(1, 40),  # tokens before the hold
    st.lists(st.integers(1, 9), min_size=1, max_size=12),  # chunks appended after it
    st.integers(1, 48),  # the hold's limit
)
def test_a_hold_keeps_what_its_length_saw_within_its_bound_and_goes_back_to_it(
    before: int, chunks: list[int], limit: int
) -> None:
    policy, bs = KVPolicy.windowed(8, sinks=4), 4
    pool = BlockPool(256, block_size=bs)
    seq = SequenceKV(0, policy, pool)
    assert seq.reserve(before)
    seq.commit(before)
    resident = dict(seq.resident_blocks())
    seq.hold(limit)
    bound = policy.max_blocks(bs, chunk=9)
    assert bound is not None
    for n in chunks:
        lapses = seq.num_tokens + n - before > limit
        assert seq.reserve(n)
        # never more than the bound of a chunk, plus what the hold's limit keeps
        assert seq.num_blocks <= bound + math.ceil(limit / bs) + 1
        seq.commit(n)
        if lapses:
            break
        assert seq.held == before
        assert all(dict(seq.resident_blocks()).get(lb) == pb for lb, pb in resident.items())  # kept as they were
    if seq.held is None:  # lapsed: the window moved on, and there is no going back
        with pytest.raises(ValueError, match="no hold"):
            seq.rewind(before)
    else:
        seq.rewind(before)
        assert (seq.num_tokens, dict(seq.resident_blocks())) == (before, resident)
    seq.release()
    assert pool.num_used == 0
