"""The engine core under faults: a corrupt session is a value, not an exception; a failing step changes nothing."""

from __future__ import annotations

import pytest
import torch

from metronome_engine import KVPolicy, SamplingParams, Stall, StepRequest
from metronome_engine.engine import Kernels
from tests.engine.tiny import faulty_engine, tiny_engine
from tests.reliability.conftest import poison

pytestmark = pytest.mark.timeout(60)


def test_non_finite_logits_drop_only_that_session_and_scrub_its_blocks(kernels: Kernels) -> None:
    core = tiny_engine(KVPolicy.windowed(8, sinks=4), num_blocks=32, kernels=kernels)
    a, b, c = (core.add_sequence() for _ in range(3))
    core.step([StepRequest(s, [5, 6, 7, 8, 9]) for s in (a, b, c)])
    held_by_b = [pb for _, pb in core.resident_blocks(b)]
    poison(core, b)

    outs = core.step([StepRequest(s, [10]) for s in (a, b, c)])

    assert [o.stall for o in outs] == [None, Stall.NUMERIC_FAULT, None]
    assert outs[0].token is not None and outs[2].token is not None
    assert outs[1].num_blocks == 0 and not core.has_sequence(b)
    assert core.pool_stats().used_blocks == core.sequence_blocks(a) + core.sequence_blocks(c)
    bs = core.pool.block_size
    for pb in held_by_b:  # scrubbed: a block reused with NaN in it would poison its next owner
        assert torch.isfinite(core.cache.k[:, :, pb * bs : (pb + 1) * bs]).all()
    # a new session takes the freed blocks and the survivors go on: nobody sees a NaN again
    d = core.add_sequence()
    for _ in range(6):
        outs = core.step([StepRequest(s, [11, 12, 13, 14]) for s in (a, c, d)])
        assert all(o.ok and o.token is not None for o in outs)
    core.free_sequence(b)  # idempotent: the engine already dropped it
    for s in (a, c, d):
        core.free_sequence(s)
    assert core.pool_stats().used_blocks == 0


def test_nan_in_the_logits_rows_of_one_session_is_reported_for_that_session_only() -> None:
    core, model = faulty_engine(KVPolicy.full(), num_blocks=32)
    a, b = core.add_sequence(), core.add_sequence(sampling=SamplingParams(temperature=1.0, seed=1))
    model.fault = (1, 3, float("nan"))  # the second session's (b's) row: sampling it would raise in multinomial
    outs = core.step([StepRequest(a, [1, 2]), StepRequest(b, [3, 4])])
    assert outs[0].ok and outs[0].num_tokens == 2
    assert outs[1].stall is Stall.NUMERIC_FAULT and not core.has_sequence(b)


def test_a_step_that_raises_after_the_forward_pass_commits_no_session() -> None:
    core, model = faulty_engine(KVPolicy.windowed(8, sinks=4), num_blocks=32)
    greedy, sampled = core.add_sequence(), core.add_sequence(sampling=SamplingParams(temperature=0.7, seed=3))
    core.step([StepRequest(greedy, [1, 2, 3]), StepRequest(sampled, [4, 5, 6])])
    before = (core.sequence_length(greedy), core.sequence_length(sampled), core.pool_stats().used_blocks)
    # finite, so not a numeric fault, but infinite once divided by the temperature: sampling raises
    model.fault = (1, 3, 3e38)
    with pytest.raises(RuntimeError, match="probability tensor"):
        core.step([StepRequest(greedy, [7, 8, 9, 10]), StepRequest(sampled, [11, 12, 13, 14])])
    # the greedy session came first and was fine, but nothing was committed for anyone
    assert (core.sequence_length(greedy), core.sequence_length(sampled), core.pool_stats().used_blocks) == before
    model.fault = None
    outs = core.step([StepRequest(greedy, [7]), StepRequest(sampled, [8])])
    assert all(o.ok for o in outs)
