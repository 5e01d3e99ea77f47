"""n_sched from a latency table, the converged cap, and the sweep/admit reports on the small model."""

from __future__ import annotations

from typing import Any

import anyio
import pytest

from metronome_bench.admit import AdmitConfig, AdmitRun, budget_in_sessions, cap_bound_by, converged_cap, run_admit
from metronome_bench.admit import summarize as summarize_admit
from metronome_bench.admit_trace import frames_after, hog_report, late_report
from metronome_bench.sweep import SweepConfig, find_knee, n_sched, run_sweep, search_n_sched, walk_knee
from metronome_bench.sweep import summarize as summarize_sweep
from metronome_bench.workload import FrameRecord, WorkloadTrace
from metronome_sdk import AdmissionConfig, TickReport


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


def test_the_knee_search_ends_next_to_the_first_count_that_misses() -> None:
    for knee in (0, 1, 2, 3, 7, 11, 16, 40):
        asked: list[int] = []

        async def meets(n: int, knee: int = knee, asked: list[int] = asked) -> bool:
            asked.append(n)
            return n <= knee

        assert anyio.run(lambda: find_knee(meets, limit=64)) == knee
        assert asked.count(knee + 1) == 2  # the count just past the knee was measured to miss, twice
        assert len(set(asked)) <= 2 * (knee + 1).bit_length() + 1  # O(log N) counts, not a linear sweep
        assert all(asked.count(n) == 1 for n in asked if n <= knee)  # a count that meets is read once

    # every count up to the limit meets: the limit, said as such
    async def always(n: int) -> bool:
        return True

    assert anyio.run(lambda: find_knee(always, limit=20)) == 16


def test_one_stalled_reading_does_not_end_the_knee_search_below_the_knee() -> None:
    stalled = {16}  # the first reading of 16 stalls; its second, like every count up to 17, meets

    async def meets(n: int) -> bool:
        if n in stalled:
            stalled.discard(n)
            return False
        return n <= 17

    assert anyio.run(lambda: find_knee(meets, limit=64)) == 17
    stalled.add(16)
    assert anyio.run(lambda: find_knee(meets, limit=64, readings=1)) == 15  # one reading: the stall decides
    with pytest.raises(ValueError, match="readings"):
        anyio.run(lambda: find_knee(meets, limit=64, readings=0))


def test_the_knee_beside_a_run_steps_from_the_last_knee_with_the_search_criterion() -> None:
    for start, knee in ((17, 17), (17, 19), (17, 14), (3, 0), (5, 30), (5, 1)):
        asked: list[int] = []

        async def meets(n: int, knee: int = knee, asked: list[int] = asked) -> bool:
            asked.append(n)
            return n <= knee

        found = anyio.run(lambda start=start, meets=meets: walk_knee(meets, start=start, reach=4))
        assert found == min(knee, start + 4)  # up to reach counts above the start; down as far as it must
        if knee < start + 4:
            assert asked.count(knee + 1) == 2  # the count past the knee missed twice, as in the search
            assert knee == 0 or asked.count(knee) == 1  # and the knee itself met at its first reading
        assert len(asked) <= 2 * abs(start - knee) + 3 and len(asked) <= 2 * start + 5  # readings near the knee
    # one stalled reading of the start does not move the knee down: the count is read again
    stalled = {17}

    async def once_stalled(n: int) -> bool:
        if n in stalled:
            stalled.discard(n)
            return False
        return n <= 17

    assert anyio.run(lambda: walk_knee(once_stalled, start=17, reach=4)) == 17
    with pytest.raises(ValueError, match="start and reach"):
        anyio.run(lambda: walk_knee(once_stalled, start=0, reach=4))


def test_admit_demand_and_pool_sit_above_the_knee() -> None:
    config = AdmitConfig(pool_sessions=8, time_scale=0.3).sized_for(12)
    assert config.pool_for("window") == 24 * config.session_bound  # the memory guard's limit is twice the knee
    assert config.pool_for("full") == 8 * config.session_bound  # kv=full keeps the experiment's pool
    mean = sum(config.duration) / 2 * config.time_scale
    assert config.arrival_rate * mean >= 24  # about twice the knee open at once
    assert config.pool_carries < 12  # kv=full outgrows its pool well below the knee
    assert AdmitConfig().sized_for(3).pool_for("window") == AdmitConfig().pool_for("window")  # never smaller


def test_small_search_measures_a_window_point_per_count() -> None:
    config = SweepConfig(period=0.05, ticks=3, warmup_ticks=1, model="small", policies=("window",))
    points = search_n_sched(config, limit=4)
    ns = [p.n for p in points]
    assert ns[:1] == [1] and all(p.policy == "window" for p in points)
    assert len(ns) == len(set(ns))  # no count measured twice
    report = summarize_sweep(config, points)
    assert report["n_sched"] in ns or report["n_sched"] == 0


def test_converged_cap_is_the_median_of_the_second_half() -> None:
    cap = [(float(t), c, c) for t, c in enumerate([4, 5, 6, 7, 8, 9, 8, 9, 8, 9, 8])]
    assert converged_cap(cap) == 8
    assert converged_cap(cap, until=4.0) == 7  # before a stall at 4 s: 4..8 -> second half 6, 7, 8
    assert converged_cap([]) == 0
    # which term set the cap, over the same rounds: 5..10 in the whole run, 2..4 before the stall
    by = ["burst"] * 5 + ["model", "budget", "budget", "budget", "running", "budget"]
    assert cap_bound_by(cap, by) == {"budget": 0.667, "model": 0.167, "running": 0.167}
    assert cap_bound_by(cap, by, until=4.0) == {"burst": 1.0}
    assert cap_bound_by(cap, [None] * len(cap)) == {}  # AIMD names no term
    # the tick budget over the same rounds (5..10 s), in whole sessions of 9 tokens: a dip at 6 s, none before 5 s
    ticks = [(0.0, 90), (4.0, 99), (5.0, 162), (6.0, 135), (7.0, 160), (10.0, 171), (11.0, 90)]
    assert budget_in_sessions(cap, ticks, 9) == {"min": 15, "median": 17, "max": 19}
    assert budget_in_sessions(cap, [(t, None) for t, _ in ticks], 9) is None  # no budget
    assert budget_in_sessions([], ticks, 9) is None


def test_a_knee_of_zero_holds_no_run_within_10_percent() -> None:
    def run(n_star: int, peak: int) -> AdmitRun:
        return AdmitRun("window", 0, n_star, False, None, peak, 0, peak, [], [], controller="model")

    config = AdmitConfig(controllers=("model",), kvs=("window",))
    runs = [run(10, 11), run(9, 12), run(0, 0)]
    entry = summarize_admit(config, runs, n_sched=10, sweep=None)["window"]["model"]
    assert entry["runs_n_star_within_10pct"] == 2  # 10 and 9; 0 is 100 % off
    assert entry["runs_peak_within_10pct"] == 2  # 11 <= 11 and 0; 12 is past it
    # a machine that held no session: no run is within 10 % of it, neither by N* nor by peak
    none = summarize_admit(config, runs, n_sched=0, sweep=None)["window"]["model"]
    assert none["runs_n_star_within_10pct"] == 0 and none["runs_peak_within_10pct"] == 0


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
            # the tick budget the point ran under ("auto": measured), and the ticks a session waited on it
            assert isinstance(p["budget_min"], int) and p["budget_min"] <= p["budget_max"]
            assert isinstance(p["budget_waits"], int) and p["budget_waits"] >= 0
    assert all(p["stalled"] == 0 for p in report["window"])


def _small_admit(**kwargs: Any) -> AdmitConfig:
    """Sessions of half a second to a second on the small model, a 50 ms tick, a 4-session pool."""
    base: dict[str, Any] = {
        "period": 0.05,
        "run_seconds": 1.0,
        "duration": (0.5, 1.0),
        "arrival_rate": 4.0,
        "pool_sessions": 4,
        "model": "small",
        "admission": AdmissionConfig(initial_limit=2, percentile=0.99, target=1.0, min_samples=8, queue_timeout=0.0),
    }
    return AdmitConfig(**{**base, **kwargs})


def test_small_admit_reports_the_issue_shape() -> None:
    config = _small_admit(run_seconds=1.5, controllers=("model", "aimd"))
    runs = run_admit(config)
    assert [(r.policy, r.controller) for r in runs] == [
        ("window", "model"),
        ("window", "aimd"),
        ("full", "model"),
        ("full", "aimd"),
    ]
    report = summarize_admit(config, runs, n_sched=3, sweep=None)
    for controller in ("model", "aimd"):
        window, full = report["window"][controller], report["full"][controller]
        assert isinstance(window["n_star"], int) and window["n_sched"] == 3
        assert isinstance(window["collapsed"], int) and window["collapsed"] == 0
        assert isinstance(full["n_star"], int) and isinstance(full["collapsed"], int)
        assert window["n_star"] <= 4  # never above the memory guard
        assert window["lost_sessions"] == 0
        assert 0 <= window["runs_n_star_within_10pct"] <= 1
        for r in window["per_run"]:
            budget = r["budget_sessions_2nd_half"]  # the tick budget is "auto": measured from the first step
            assert budget is not None and budget["min"] <= budget["median"] <= budget["max"]
    assert all(
        sum(r["cap_bound_by"].values()) == pytest.approx(1.0, abs=0.01) for r in report["window"]["model"]["per_run"]
    )
    assert all(r.cap for r in runs)


def test_a_hog_mid_run_is_reported_with_the_cap_around_it() -> None:
    config = _small_admit(
        controllers=("model",),
        kvs=("window",),
        hog=0.3,
        hog_start=0.2,
        recovery=0.3,
    )
    assert config.horizon == pytest.approx(1.0)
    (run,) = run_admit(config)
    assert run.hog is not None and run.hog[1] - run.hog[0] >= 0.3
    hog = run.as_dict()["hog"]
    assert hog["start_s"] == pytest.approx(0.2, abs=0.2)
    assert hog["cap_series"] and all(len(row) == 3 for row in hog["cap_series"])
    assert isinstance(hog["shed_during"], int)


def test_the_hog_report_times_the_cut_and_the_recovery_to_within_a_tenth() -> None:
    # (seconds, cap, sessions open): 20 before the hog from 10 s to 20 s; back to 18 (0.9 x 20) 7 s after it
    cap = [(9.0, 20, 20), (11.0, 20, 20), (12.0, 15, 18), (19.0, 14, 14), (22.0, 16, 16), (27.0, 18, 18)]
    report = hog_report(cap, shed=[(13.0, 1.0), (30.0, 1.0)], hog=(10.0, 20.0))
    assert report["cap_before"] == 20 and report["cap_min_during"] == 14
    assert report["cap_cut_after_s"] == 2.0
    assert report["recovered_after_s"] == 7.0
    assert report["shed_during"] == 1  # the shed 10 s after the hog is not the hog's
    assert hog_report(cap[:-1], shed=[], hog=(10.0, 20.0))["recovered_after_s"] is None  # never back


def _tick(at: float, step: float, waiting: tuple[int, ...] = ()) -> TickReport:
    return TickReport(
        tick=0, time=at, sessions=2, served=2, stalled=(), latencies=(), step_seconds=step, used_blocks=1,
        pool_blocks=8, waiting=waiting,
    )  # fmt: skip


def test_late_frames_are_told_by_outcome_and_second_beside_the_ticks_that_explain_them() -> None:
    trace = WorkloadTrace(start=100.0, end=130.0)
    trace.frames = [
        FrameRecord(0, 0, 105.0, "ok", 0.9),  # before the 10 s settle: not judged
        FrameRecord(0, 1, 111.2, "ok", 0.2),
        FrameRecord(0, 2, 111.7, "ok", 0.7),  # answered past the 0.5 s deadline
        FrameRecord(1, 0, 111.8, "dropped"),
        FrameRecord(1, 1, 115.0, "error"),
        FrameRecord(1, 2, 116.0, "shed"),  # the session's typed end: not a late frame
        FrameRecord(1, 3, 129.5, "unanswered"),  # in flight when the run ended: not judged
    ]
    trace.ticks = [_tick(105.0, 0.6), _tick(111.5, 0.2, waiting=(1,)), _tick(112.0, 0.55), _tick(115.5, 0.3)]
    late = late_report(trace, settle=10.0, deadline=0.5)
    assert late["by_outcome"] == {"dropped": 1, "error": 1, "ok": 1}
    assert late["by_second"] == {"11": 2, "15": 1}
    assert (late["ticks"], late["steps_over_deadline"], late["budget_waits"]) == (3, 1, 1)
    assert frames_after(trace, 10.0, 0.5)[1:] == (4, 3)  # judged, late: the same frames


def test_the_knee_is_read_beside_each_window_run_between_the_policies() -> None:
    config = _small_admit(
        controllers=("model", "aimd"),
        kvs=("window",),
        runs=2,
    )
    sweep = SweepConfig(period=0.05, ticks=3, warmup_ticks=1, model="small", policies=("window",))
    order: list[str] = []
    runs = run_admit(
        config,
        knee=sweep,
        n_sched=2,
        on_knee=lambda k: order.append(f"knee {k.run}"),
        on_run=lambda r: order.append(f"{r.controller} {r.run}"),
    )
    assert [(r.controller, r.run) for r in runs] == [("model", 0), ("aimd", 0), ("model", 1), ("aimd", 1)]
    # each run index's knee is read once, after its first policy's run, and stands beside both
    assert order[0] == "knee 0" and order.count("knee 0") == 1 and order.count("knee 1") == 1
    assert runs[0].knee is runs[1].knee and runs[2].knee is runs[3].knee and runs[0].knee is not runs[2].knee
    for r in runs:
        assert r.knee is not None and r.knee.points and all(p.policy == "window" for p in r.knee.points)
        assert r.as_dict()["knee_beside"] == r.knee.knee
    report = summarize_admit(config, runs, n_sched=2, sweep=None)
    assert [k["run"] for k in report["knee_beside"]] == [0, 1]
    assert all(k["points"] and isinstance(k["knee"], int) for k in report["knee_beside"])
    for controller in ("model", "aimd"):
        entry = report["window"][controller]
        assert entry["knee_beside"] == [r.knee.knee for r in runs if r.controller == controller and r.knee]
        assert 0 <= entry["runs_n_star_within_10pct_of_knee_beside"] <= 2
        assert 0 <= entry["runs_peak_within_10pct_of_knee_beside"] <= 2
    with pytest.raises(ValueError, match="go together"):
        run_admit(config, knee=sweep)


def test_admit_config_checks_its_policies() -> None:
    with pytest.raises(ValueError, match="controllers must be"):
        AdmitConfig(controllers=("pid",))  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="hog must be"):
        AdmitConfig(hog=-1.0)
