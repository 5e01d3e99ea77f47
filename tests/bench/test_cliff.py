"""The cliff report on the small model: collapses, and the t_sat gauge scored against them."""

from __future__ import annotations

import pytest

from metronome_bench.cliff import CliffConfig, run_cliff, summarize


def test_config_sizes_the_pool_for_the_window_at_its_bound() -> None:
    c = CliffConfig(sessions=8, window=256, sinks=4, block_size=16, tokens_per_frame=8)
    assert c.session_bound == 1 + 17 + 1  # ceil(4/16) + ceil((256 + 9 - 1)/16) + 1
    assert c.pool_blocks == 8 * 19
    assert c.blocks_per_second == pytest.approx(9 / 16 / 0.08)
    with pytest.raises(ValueError):
        CliffConfig(time_scale=0)


def test_small_cliff_run_reports_the_issue_shape() -> None:
    config = CliffConfig(
        sessions=4, runs=2, window=32, arrival_spread=0.1, duration=(3.0, 4.0), time_scale=0.25, concurrency=4
    )
    runs = run_cliff(config)
    report = summarize(config, runs)
    assert set(report) >= {"full", "window", "config"}
    full, window = report["full"], report["window"]
    assert isinstance(full["runs"], int) and full["runs"] == 2
    assert isinstance(full["collapsed"], int) and isinstance(window["collapsed"], int)
    assert window["runs"] == 2
    assert window["collapsed"] == 0  # the pool holds every window session at its bound
    assert window["stalls"] == 0
    # four sessions of 3-4 x 0.25 s at 9 tokens per 20 ms tick outgrow the window's 4 x 4 blocks with room to
    # spare: with sessions a third as long, one fresh `make test` on a 2-core EPYC saw neither full run collapse
    assert full["collapsed"] == 2
    for r in full["per_run"]:
        # the gauge from the first tick, scored against the stall that came
        points = r["gauge"]["points"]
        assert points[0][0] < 0.1 and any(p[1] is not None for p in points)
        assert r["forecast"]["stall_at_s"] == r["stalled_at_s"]
        assert r["forecast"]["alarm"]["first_s"] is not None  # a 2 s run collapses well inside a 10 s alarm
    for r in window["per_run"]:
        assert all(p[1] is None for p in r["gauge"]["points"])  # bounded: the gauge says never
    assert window["forecast"]["alarm"]["false_alarm_runs"] == 0
    assert full["forecast"]["alarm"]["collapses"] == 2


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
