"""The t_sat predictor, collapse detection and the cliff report, on synthetic traces and the small model."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from metronome_sdk.bench.cliff import CliffConfig, predict_at_last_change, run_cliff, summarize, t_sat


@dataclass
class Tick:
    time: float
    sessions: int
    used_blocks: int
    pool_blocks: int
    stalled: tuple[int, ...] = ()


def synthetic(n: int, r_blocks: float, pool: int, dt: float, *, start_used: int = 0) -> list[Tick]:
    """N sessions growing at exactly r blocks per second each until the pool is full, then a stall."""
    ticks, used, t = [Tick(0.0, n, start_used, pool)], float(start_used), 0.0
    while True:
        t += dt
        used += n * r_blocks * dt
        if used > pool:
            ticks.append(Tick(t, n, pool, pool, stalled=(1,)))
            return ticks
        ticks.append(Tick(t, n, int(used), pool))


def test_t_sat_formula() -> None:
    assert t_sat(0.5, 4, 0.05) == pytest.approx(2.5)
    assert t_sat(1.2, 4, 0.05) == 0.0  # already over: now
    with pytest.raises(ValueError):
        t_sat(0.5, 0, 0.05)


def test_prediction_on_a_synthetic_linear_trace_is_within_one_tick() -> None:
    pool, n, r_blocks, dt = 200, 4, 2.0, 0.01
    ticks = synthetic(n, r_blocks, pool, dt, start_used=40)
    p = predict_at_last_change(ticks, r_blocks / pool)
    assert p is not None
    assert p.made_at == 0.0 and p.sessions == n and p.rho0 == pytest.approx(0.2)
    assert p.predicted == pytest.approx((1 - 0.2) / (n * r_blocks / pool))  # 20 s
    assert abs(p.observed - p.predicted) <= dt + 1e-9
    assert p.rel_err < 0.01


def test_prediction_is_made_one_tick_after_the_last_change_of_the_session_count() -> None:
    pool = 100
    ticks = [Tick(0.0, 1, 0, pool), Tick(1.0, 2, 10, pool), Tick(2.0, 3, 30, pool), Tick(3.0, 3, 60, pool)]
    ticks += [Tick(4.0, 3, 90, pool), Tick(5.0, 3, 100, pool, stalled=(2,))]
    p = predict_at_last_change(ticks, 0.1)
    assert p is not None
    # the count changed at 2.0 s; a departure's blocks show one tick later, so the state is read at 3.0 s
    assert (p.made_at, p.sessions, p.rho0) == (3.0, 3, 0.6)
    assert p.observed == 2.0  # the pool was full at 5.0 s, the tick of the stall
    assert p.predicted == pytest.approx(0.4 / 0.3)


def test_a_change_on_the_tick_before_the_stall_is_read_where_it_happened() -> None:
    ticks = [Tick(0.0, 4, 0, 100), Tick(1.0, 4, 80, 100), Tick(2.0, 3, 95, 100), Tick(3.0, 3, 100, 100, stalled=(1,))]
    p = predict_at_last_change(ticks, 0.1)
    assert p is not None
    assert (p.made_at, p.sessions, p.rho0) == (2.0, 3, 0.95)


def test_observed_saturation_is_the_first_full_tick_before_the_stall() -> None:
    pool = 100
    ticks = [Tick(0.0, 4, 20, pool), Tick(1.0, 4, 60, pool), Tick(2.0, 4, 100, pool)]
    ticks += [Tick(3.0, 4, 100, pool, stalled=(1, 2))]
    p = predict_at_last_change(ticks, 0.1)
    assert p is not None
    assert p.made_at == 0.0 and p.observed == 2.0 and p.predicted == pytest.approx(0.8 / 0.4)
    assert p.rel_err == pytest.approx(0.0)


def test_no_stall_no_collapse_no_prediction() -> None:
    ticks = [Tick(float(i), 3, 10 * i, 100) for i in range(5)]
    assert predict_at_last_change(ticks, 0.1) is None


def test_config_sizes_the_pool_for_the_window_at_its_bound() -> None:
    c = CliffConfig(sessions=8, window=256, sinks=4, block_size=16, tokens_per_frame=8)
    assert c.session_bound == 1 + 17 + 1  # ceil(4/16) + ceil((256 + 9 - 1)/16) + 1
    assert c.pool_blocks == 8 * 19
    assert c.blocks_per_second == pytest.approx(9 / 16 / 0.08)
    assert c.growth_rate == pytest.approx(c.blocks_per_second / c.pool_blocks)
    with pytest.raises(ValueError):
        CliffConfig(time_scale=0)


def test_small_cliff_run_reports_the_issue_shape() -> None:
    config = CliffConfig(
        sessions=4, runs=2, window=32, arrival_spread=0.1, duration=(1.0, 1.5), time_scale=0.25, concurrency=4
    )
    runs = run_cliff(config)
    report = summarize(config, runs)
    assert set(report) >= {"full", "window", "config"}
    full, window = report["full"], report["window"]
    assert isinstance(full["runs"], int) and full["runs"] == 2
    assert isinstance(full["collapsed"], int) and isinstance(window["collapsed"], int)
    assert full["t_sat_rel_err_median"] is None or isinstance(full["t_sat_rel_err_median"], float)
    assert window["runs"] == 2
    assert window["collapsed"] == 0  # the pool holds every window session at its bound
    assert window["stalls"] == 0
    # four sessions of 1-1.5 x 0.25 s at 9 tokens per 20 ms tick outgrow the window's 4 x 4 blocks
    assert full["collapsed"] == 2
    for r in full["per_run"]:
        assert r["t_sat_observed_s"] is not None and r["t_sat_predicted_s"] is not None


def test_silent_mode_answers_stalled_frames_empty_and_still_counts_stalls() -> None:
    config = CliffConfig(
        sessions=4, runs=1, window=32, arrival_spread=0.1, duration=(1.0, 1.5), time_scale=0.25, silent=True
    )
    report = summarize(config, run_cliff(config))
    full = report["full"]
    assert full["collapsed"] == 1 and full["stalls"] > 0
    silent = full["silent"]
    assert silent["frames_empty"] > 0  # a stalled frame came back empty, as if answered
    assert full["per_run"][0]["frames"].get("stalled", 0) == 0  # and nobody heard of the stall
