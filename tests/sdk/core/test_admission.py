"""AIMD admission and the memory guard, driven by an injected clock and synthetic latency."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metronome_sdk import AdmissionConfig
from metronome_sdk._core.admission import AIMDAdmitter, MemoryGuard, percentile
from tests.sdk.conftest import FakeClock

DEADLINE = 0.1  # seconds; the threshold is target * deadline = 0.08 s
LOW, HIGH = 0.01, 0.2


def admitter(clock: FakeClock, guard: MemoryGuard | None = None, **cfg: float) -> AIMDAdmitter:
    config = AdmissionConfig(**{"initial_limit": 4, "interval": 1.0, "min_samples": 4, **cfg})  # type: ignore[arg-type]
    return AIMDAdmitter(config, deadline=DEADLINE, guard=guard, clock=clock)


def one_interval(a: AIMDAdmitter, clock: FakeClock, latency: float, in_flight: int) -> int:
    for _ in range(a.config.min_samples):
        a.observe(latency)
    clock.advance(a.config.interval)
    return a.update(in_flight)


def test_grows_additively_under_low_latency_when_in_demand() -> None:
    clock = FakeClock()
    a = admitter(clock)
    limits = [one_interval(a, clock, LOW, in_flight=a.limit) for _ in range(5)]
    assert limits == [5, 6, 7, 8, 9]


def test_does_not_grow_without_demand() -> None:
    clock = FakeClock()
    a = admitter(clock)
    assert one_interval(a, clock, LOW, in_flight=1) == 4


def test_rejections_count_as_demand() -> None:
    clock = FakeClock()
    a = admitter(clock)
    for _ in range(3):
        a.record_rejection()
    assert one_interval(a, clock, LOW, in_flight=1) == 5


def test_cuts_multiplicatively_above_target() -> None:
    clock = FakeClock()
    a = admitter(clock, initial_limit=20, max_limit=64)
    assert one_interval(a, clock, HIGH, in_flight=20) == 18  # 0.9 x 20
    assert one_interval(a, clock, HIGH, in_flight=18) == 16  # floor(0.9 x 18)


def test_a_cut_removes_at_least_one_session_and_stops_at_min_limit() -> None:
    clock = FakeClock()
    a = admitter(clock, initial_limit=3, min_limit=2)
    assert one_interval(a, clock, HIGH, in_flight=3) == 2  # floor(2.7) = 2
    assert one_interval(a, clock, HIGH, in_flight=2) == 2


def test_judges_the_high_percentile_not_the_mean() -> None:
    clock = FakeClock()
    a = admitter(clock, min_samples=20, initial_limit=10)
    for _ in range(18):
        a.observe(LOW)
    for _ in range(2):  # 10 % of frames late: the p95 is late although the mean is fine
        a.observe(HIGH)
    clock.advance(1.0)
    assert a.update(10) == 9


def test_no_decision_before_the_interval_or_without_enough_samples() -> None:
    clock = FakeClock()
    a = admitter(clock)
    for _ in range(4):
        a.observe(HIGH)
    clock.advance(0.5)
    assert a.update(4) == 4  # too early
    clock.advance(0.5)
    b = admitter(clock)
    b.observe(HIGH)
    clock.advance(1.0)
    assert b.update(4) == 4  # one sample is not evidence
    assert a.update(4) == 3  # now due, with enough samples


def test_each_decision_uses_only_latency_measured_since_the_last() -> None:
    clock = FakeClock()
    a = admitter(clock, initial_limit=10)
    assert one_interval(a, clock, HIGH, in_flight=10) == 9
    assert one_interval(a, clock, LOW, in_flight=9) == 10  # the old high samples were dropped


def test_never_exceeds_the_memory_guard() -> None:
    clock = FakeClock()
    guard = MemoryGuard(pool_blocks=40, session_blocks=10)
    a = admitter(clock, guard, initial_limit=8)
    assert a.limit == 4  # clamped at construction
    for _ in range(10):
        assert one_interval(a, clock, LOW, in_flight=a.limit) == 4
    assert a.admits(3)
    assert not a.admits(4)


def test_admits_below_the_limit_only() -> None:
    a = admitter(FakeClock(), initial_limit=2)
    assert a.admits(0) and a.admits(1)
    assert not a.admits(2)


def test_memory_guard_bounded_and_unbounded() -> None:
    bounded = MemoryGuard(pool_blocks=25, session_blocks=6)
    assert bounded.limit == 4
    assert bounded.admits(3, free_blocks=0)  # the bound, not what is free now, decides
    assert not bounded.admits(4, free_blocks=25)
    full = MemoryGuard(pool_blocks=25, session_blocks=None)
    assert full.limit is None
    assert full.admits(100, free_blocks=1)  # it cannot see growth: only what is free now
    assert not full.admits(0, free_blocks=0)


def test_retry_after_is_the_time_to_the_next_decision() -> None:
    clock = FakeClock()
    a = admitter(clock)
    assert a.retry_after() == pytest.approx(1.0)
    clock.advance(0.75)
    assert a.retry_after() == pytest.approx(0.25)
    clock.advance(5.0)
    assert a.retry_after() == pytest.approx(0.1)  # overdue: a tenth of an interval


def test_percentile_nearest_rank() -> None:
    samples = [float(i) for i in range(1, 101)]
    assert percentile(samples, 0.95) == 95.0
    assert percentile(samples, 0.5) == 50.0
    assert percentile([3.0], 0.99) == 3.0
    with pytest.raises(ValueError, match="no samples"):
        percentile([], 0.5)


@settings(max_examples=60, deadline=None)
@given(
    steps=st.lists(
        st.tuples(st.floats(0.0, 0.5), st.integers(0, 40), st.floats(0.0, 3.0)),
        max_size=40,
    ),
    session_blocks=st.one_of(st.none(), st.integers(1, 20)),
)
def test_limit_stays_within_bounds_and_guard(steps: list[tuple[float, int, float]], session_blocks: int | None) -> None:
    clock = FakeClock()
    guard = MemoryGuard(pool_blocks=100, session_blocks=session_blocks)
    a = admitter(clock, guard, min_limit=1, max_limit=30)
    ceiling = min(30, guard.limit) if guard.limit is not None else 30
    for latency, in_flight, dt in steps:
        a.observe(latency)
        clock.advance(dt)
        limit = a.update(in_flight)
        assert 1 <= limit <= ceiling
