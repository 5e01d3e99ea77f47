"""The workload generator: seeded, deterministic, within its bounds."""

from __future__ import annotations

import pytest

from metronome_bench.workload import (
    FrameRecord,
    SessionPlan,
    StreamSpec,
    WorkloadTrace,
    plan_arrivals,
    plan_sessions,
)


def test_plan_sessions_is_seeded_and_deterministic() -> None:
    a = plan_sessions(8, seed=3, arrival_spread=2.0, duration=(1.0, 5.0))
    b = plan_sessions(8, seed=3, arrival_spread=2.0, duration=(1.0, 5.0))
    c = plan_sessions(8, seed=4, arrival_spread=2.0, duration=(1.0, 5.0))
    assert a == b
    assert a != c
    assert len(a) == 8
    assert sorted(p.index for p in a) == list(range(8))
    assert [p.arrival for p in a] == sorted(p.arrival for p in a)
    assert all(0.0 <= p.arrival < 2.0 and 1.0 <= p.duration <= 5.0 for p in a)


def test_plan_arrivals_is_seeded_and_within_the_horizon() -> None:
    a = plan_arrivals(rate=2.0, horizon=10.0, seed=1, duration=(3.0, 4.0), first=2)
    assert a == plan_arrivals(rate=2.0, horizon=10.0, seed=1, duration=(3.0, 4.0), first=2)
    assert a[:2] == [SessionPlan(0, 0.0, a[0].duration), SessionPlan(1, 0.0, a[1].duration)]
    assert all(0.0 <= p.arrival < 10.0 and 3.0 <= p.duration <= 4.0 for p in a)
    assert 5 < len(a) < 40  # about rate x horizon, plus the first two


@pytest.mark.parametrize(
    "kwargs",
    [
        {"n": 0, "seed": 0, "arrival_spread": 1.0, "duration": (1.0, 2.0)},
        {"n": 2, "seed": 0, "arrival_spread": 1.0, "duration": (2.0, 1.0)},
        {"n": 2, "seed": 0, "arrival_spread": 1.0, "duration": (0.0, 1.0)},
    ],
)
def test_plan_sessions_rejects_bad_input(kwargs: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        plan_sessions(**kwargs)  # type: ignore[arg-type]


def test_stream_spec_frame_and_rate() -> None:
    spec = StreamSpec(period=0.08, tokens_per_frame=8, lead=0.004)
    assert spec.frame().tokens == tuple(range(32, 40))
    assert spec.tokens_per_tick == 9  # the frame plus the fed-back output token


def test_unanswered_frames_count_with_the_time_they_waited() -> None:
    trace = WorkloadTrace(start=0.0, end=10.0)
    ok = FrameRecord(0, 0, 1.0, "ok", 0.2)
    lost = FrameRecord(0, 1, 4.0, "stalled")
    assert trace.waited(ok) == 0.2
    assert trace.waited(lost) == 6.0
