"""The step cost model, the calibration run and the watchdog's slow-or-stuck verdict, without timing anything real."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from metronome_engine import KVPolicy
from metronome_sdk._core.cost import StepCost, calibrate
from metronome_sdk._core.watchdog import Verdict, judge
from metronome_sdk._core.worker import CoreThread
from tests.sdk.slowed import SlowedBackend

pytestmark = pytest.mark.timeout(60)


def test_a_line_is_recovered_from_exact_samples() -> None:
    cost = StepCost([(1, 0.050), (8, 0.064), (64, 0.176)])
    assert cost.ready
    assert cost.fixed == pytest.approx(0.048) and cost.per_token == pytest.approx(0.002)
    assert cost.tokens_within(0.060) == 6
    assert cost.tokens_within(0.040) == 0  # even the fixed cost does not fit
    assert cost.step_tokens() == 24  # an extra step costs what 24 tokens do


def test_measured_steps_move_the_fit() -> None:
    cost = StepCost([(1, 0.010), (64, 0.073)])
    before = cost.tokens_within(0.060)
    for _ in range(64):  # the machine got twice as slow per token
        cost.observe(32, 0.010 + 0.002 * 32)
    assert cost.tokens_within(0.060) < before
    assert cost.slowest() >= 1.0


def test_one_token_count_is_not_enough_to_tell_fixed_from_per_token() -> None:
    cost = StepCost()
    assert not cost.ready
    cost.observe(8, 0.02)
    cost.observe(8, 0.03)
    assert not cost.ready
    cost.observe(1, 0.01)
    assert cost.ready


@given(st.lists(st.tuples(st.integers(1, 512), st.floats(0, 10)), min_size=1, max_size=40))
def test_any_samples_give_a_usable_model(samples: list[tuple[int, float]]) -> None:
    cost = StepCost(samples)
    assert cost.fixed >= 0 and cost.per_token > 0
    assert all(cost.seconds(t) >= 0 for t in (1, 64))
    assert cost.tokens_within(1.0) >= 0


def test_bad_samples_are_refused() -> None:
    with pytest.raises(ValueError, match="tokens >= 1"):
        StepCost([(0, 0.1)])
    with pytest.raises(ValueError, match="finite seconds"):
        StepCost().observe(1, float("nan"))


def test_the_calibration_times_real_steps_and_frees_what_it_opened() -> None:
    core = SlowedBackend(KVPolicy.windowed(8, sinks=4), fixed=0.0, per_token=0.0)
    ticks = itertools.count()
    samples = calibrate(core, chunk=16, sessions=4, clock=lambda: float(next(ticks)))
    assert sorted({t for t, _ in samples}) == [1, 4, 16]  # batch 1, batch 4, a chunk of 16
    assert all(s == 1.0 for _, s in samples)  # each step read the clock twice
    assert core.steps[0] == 4  # the warm-up, not among the samples
    assert core.pool_stats().sequences == 0 and core.pool_stats().used_blocks == 0


def test_the_calibration_skips_steps_the_pool_cannot_take() -> None:
    core = SlowedBackend(KVPolicy.full(), fixed=0.0, per_token=0.0, num_blocks=4, block_size=4)
    samples = calibrate(core, chunk=64, sessions=2)
    assert samples and all(t < 64 for t, _ in samples)
    assert core.pool_stats().used_blocks == 0


def test_slow_or_stuck() -> None:
    # working (CPU time in the last period), within four times what its tokens take: slow
    assert judge(worked=2.0, recent=0.5, window=1.0, expected=1.0, slack=4.0) is Verdict.SLOW
    # working on a shared CPU: a little CPU each period is still progress
    assert judge(worked=0.3, recent=0.05, window=1.0, expected=1.0, slack=4.0) is Verdict.SLOW
    # worked four times what its tokens take: spinning
    assert judge(worked=4.0, recent=1.0, window=1.0, expected=1.0, slack=4.0) is Verdict.STUCK
    # no CPU time in the last period: blocked, however little it has run
    assert judge(worked=0.5, recent=0.0, window=1.0, expected=1.0, slack=4.0) is Verdict.STUCK
    # nothing measured, or no CPU clock: the limit alone decides
    assert judge(worked=0.5, recent=0.5, window=1.0, expected=None, slack=4.0) is Verdict.STUCK
    assert judge(worked=None, recent=None, window=1.0, expected=1.0, slack=4.0) is Verdict.STUCK


async def test_the_core_thread_reports_its_cpu_time() -> None:
    worker = CoreThread()
    assert worker.cpu_seconds() is None  # no thread yet
    await worker.call(lambda: None)
    idle = worker.cpu_seconds()
    await worker.call(lambda: sum(range(200_000)))  # work: its CPU time advances
    busy = worker.cpu_seconds()
    await worker.aclose()
    assert idle is not None and busy is not None and busy > idle
