"""n_sched from a latency table, the converged cap, and the sweep/admit reports on the small model."""

from __future__ import annotations

from metronome_sdk import AdmissionConfig
from metronome_sdk.bench.admit import AdmitConfig, converged_cap, run_admit
from metronome_sdk.bench.admit import summarize as summarize_admit
from metronome_sdk.bench.sweep import SweepConfig, n_sched, run_sweep
from metronome_sdk.bench.sweep import summarize as summarize_sweep


def test_n_sched_is_the_largest_n_whose_p99_meets_the_deadline() -> None:
    table = [{"n": 1, "p99_ms": 100.0}, {"n": 4, "p99_ms": 300.0}, {"n": 8, "p99_ms": 490.0}]
    table += [{"n": 12, "p99_ms": 900.0}, {"n": 16, "p99_ms": 1450.0}]
    assert n_sched(table, 500.0) == 8
    assert n_sched(list(reversed(table)), 500.0) == 8  # order does not matter
    assert n_sched(table, 50.0) == 0
    assert n_sched(table, 1000.0) == 12
    # one noisy point below the wall (a load spike on a shared CPU) does not hide the larger N
    noisy = [{"n": 1, "p99_ms": 100.0}, {"n": 4, "p99_ms": 8000.0}, {"n": 8, "p99_ms": 400.0}]
    assert n_sched(noisy, 500.0) == 8


def test_converged_cap_is_the_median_of_the_second_half() -> None:
    cap = [(float(t), c, c) for t, c in enumerate([4, 5, 6, 7, 8, 9, 8, 9, 8, 9, 8])]
    assert converged_cap(cap) == 8
    assert converged_cap(cap, until=4.0) == 7  # before a stall at 4 s: 4..8 -> second half 6, 7, 8
    assert converged_cap([]) == 0


def test_small_sweep_reports_the_issue_shape() -> None:
    config = SweepConfig(ns=(1, 3), period=0.05, ticks=4, warmup_ticks=1, model="small")
    points = run_sweep(config)
    report = summarize_sweep(config, points)
    assert isinstance(report["deadline_ms"], float) and report["deadline_ms"] == 50.0
    assert isinstance(report["n_sched"], int)
    for kind in ("full", "window"):
        assert [p["n"] for p in report[kind]] == [1, 3]
        for p in report[kind]:
            assert isinstance(p["p50_ms"], float) and isinstance(p["p99_ms"], float)
            assert p["p50_ms"] <= p["p99_ms"]
    assert all(p["stalled"] == 0 for p in report["window"])


def test_small_admit_reports_the_issue_shape() -> None:
    config = AdmitConfig(
        period=0.05,
        run_seconds=1.5,
        duration=(0.5, 1.0),
        arrival_rate=4.0,
        pool_sessions=4,
        model="small",
        admission=AdmissionConfig(initial_limit=2, percentile=0.99, target=1.0, min_samples=8, queue_timeout=0.0),
    )
    runs = run_admit(config)
    report = summarize_admit(config, runs, n_sched=3, sweep=None)
    window, full = report["window"], report["full"]
    assert isinstance(window["n_star"], int) and window["n_sched"] == 3
    assert isinstance(window["collapsed"], int) and window["collapsed"] == 0
    assert isinstance(full["n_star"], int) and isinstance(full["collapsed"], int)
    assert window["n_star"] <= 4  # never above the memory guard
    assert all(r.cap for r in runs)
