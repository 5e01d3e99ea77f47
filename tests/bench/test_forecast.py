"""Scoring the t_sat gauge as a forecast, on made-up series; the traffic that varies; one run of the command."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import pytest

from metronome_bench.forecast import (
    GaugePoint,
    alarm,
    gauge_series,
    replay,
    score,
    summarize_scores,
)
from metronome_bench.traffic import Talk, TalkMix, talks
from metronome_bench.workload import FrameLoad, SessionPlan
from metronome_sdk.cli import main


def exact(stall: float, dt: float = 0.1, *, bias: float = 1.0) -> list[GaugePoint]:
    """A gauge that says ``bias`` x the time left, every ``dt`` seconds up to the stall."""
    n = round(stall / dt)
    return [GaugePoint(i * dt, bias * (stall - i * dt), 4, i / n) for i in range(n + 1)]


def test_a_gauge_that_knows_the_time_left_scores_zero_at_every_lead() -> None:
    s = score(exact(30.0), 30.0, leads=(1.0, 5.0, 20.0), threshold=10.0)
    assert s.collapsed and not s.false_alarm
    for lead in (1.0, 5.0, 20.0):
        ls = s.leads[lead]
        assert ls is not None
        assert ls.truth == pytest.approx(lead) and ls.rel_err == pytest.approx(0.0, abs=1e-9)
    # fired at the first tick with under 10 s left (9.9 s: the tick at 20.0 reads 10 s exactly)
    assert s.alarm.first == pytest.approx(20.1) and s.alarm_lead == pytest.approx(9.9)


def test_the_error_is_read_at_the_last_tick_at_or_before_the_lead() -> None:
    series = [GaugePoint(0.0, 12.0), GaugePoint(4.0, 9.0), GaugePoint(9.5, 2.0)]
    s = score(series, 10.0, leads=(5.0, 1.0, 20.0))
    five = s.leads[5.0]
    assert five is not None and (five.at, five.gauge, five.truth) == (4.0, 9.0, 6.0)
    assert five.rel_err == pytest.approx(0.5)
    one = s.leads[1.0]
    assert one is not None and one.at == 4.0  # 9.5 s is after 10 - 1: not yet known at 9 s
    assert s.leads[20.0] is None  # collapsed before a 20 s lead existed: no score


def test_a_gauge_that_says_never_is_a_miss_counted_in_the_median() -> None:
    series = [GaugePoint(float(t), None) for t in range(10)]
    s = score(series, 9.5, leads=(2.0,))
    miss = s.leads[2.0]
    assert miss is not None and math.isinf(miss.rel_err)
    assert s.alarm.first is None and s.alarm_lead is None
    summary = summarize_scores([s, score(exact(9.5), 9.5, leads=(2.0,))])
    assert summary["leads"]["2"] == {"runs": 2, "misses": 1, "rel_err_median": None, "rel_err_p90": None}
    assert summary["alarm"]["collapses"] == 2 and summary["alarm"]["fired_before_collapse"] == 1


def test_alarm_episodes_and_time_firing() -> None:
    values = [20.0, 8.0, 7.0, 15.0, 9.0, None, 3.0]
    series = [GaugePoint(float(i), v) for i, v in enumerate(values)]
    a = alarm(series, 10.0)
    assert (a.first, a.episodes) == (1.0, 3)
    assert a.seconds == pytest.approx(2.0 + 1.0 + 0.0)  # 1-3 s, 4-5 s, and the last tick
    assert alarm(series, 10.0, until=3.5).episodes == 1
    with pytest.raises(ValueError):
        alarm(series, 0.0)


def test_an_alarm_in_a_run_that_never_collapsed_is_false() -> None:
    calm = score([GaugePoint(0.0, 40.0), GaugePoint(1.0, 6.0), GaugePoint(2.0, 30.0)], None, threshold=10.0)
    quiet = score([GaugePoint(0.0, None), GaugePoint(1.0, None)], None, threshold=10.0)
    assert calm.false_alarm and not quiet.false_alarm
    assert all(v is None for v in calm.leads.values())
    summary = summarize_scores([calm, quiet])
    assert summary["alarm"]["runs_without_collapse"] == 2
    assert summary["alarm"]["false_alarm_runs"] == 1 and summary["alarm"]["false_alarm_episodes"] == 1


def test_the_median_over_runs_and_bad_input() -> None:
    scores = [score(exact(30.0, bias=b), 30.0, leads=(5.0,)) for b in (0.9, 1.0, 1.3)]
    assert summarize_scores(scores)["leads"]["5"]["rel_err_median"] == pytest.approx(0.1)
    assert summarize_scores(scores)["leads"]["5"]["rel_err_p90"] == pytest.approx(0.3)
    with pytest.raises(ValueError, match="time order"):
        score([GaugePoint(1.0, 2.0), GaugePoint(0.5, 2.0)], 3.0)
    with pytest.raises(ValueError, match="lead"):
        score(exact(3.0), 3.0, leads=(0.0,))


@dataclass
class Tick:
    time: float
    sessions: int
    used_blocks: int
    pool_blocks: int
    grown_blocks: int
    t_sat: float | None = None


def test_replay_is_the_engines_formula_over_the_engines_rate() -> None:
    # 2 sessions taking 1 block each per 0.5 s tick: r = 2 blocks/s, 4 blocks/s together
    ticks = [Tick(100.0 + 0.5 * i, 2, 2 * i, 40, 2 if i else 0) for i in range(6)]
    series = replay(ticks, 100.0, window=5.0)
    assert series[0].t_sat is None  # no growth measured yet
    assert series[-1].t_sat == pytest.approx((40 - 10) / 4.0)
    assert series[-1].time == pytest.approx(2.5) and series[-1].occupancy == pytest.approx(0.25)
    assert all(p.t_sat is None for p in replay(ticks, 100.0, window=5.0, bounded=True))
    live = gauge_series([Tick(101.0, 2, 5, 40, 1, 3.5)], 100.0)
    assert live == [GaugePoint(1.0, 3.5, 2, 5 / 40)]


def test_talk_is_seeded_starts_with_a_turn_and_varies() -> None:
    a, b = Talk(seed=3, period=0.08), Talk(seed=3, period=0.08)
    loads = [a.load(i) for i in range(2000)]
    assert loads == [b.load(i) for i in range(2000)]
    assert loads[0] == FrameLoad(TalkMix().speech_tokens)  # a first frame must carry input
    kinds = {s.kind for s in a.segments}
    assert kinds == {"silence", "turn", "answer"}
    assert {FrameLoad(1), FrameLoad(8)} <= set(loads) and any(fl.decode > 1 for fl in loads)
    assert all(fl.tokens >= 1 for fl in loads)  # never empty: a frame after a stalled one must carry input
    assert a.load(5) == loads[5]  # asking again, or out of order, gives the same frame
    assert [fl for fl in loads] != [Talk(seed=4, period=0.08).load(i) for i in range(2000)]
    plans = [SessionPlan(0, 0.0, 5.0), SessionPlan(1, 0.0, 5.0)]
    pair = talks(plans, seed=0, period=0.08)
    assert [pair[0].load(i) for i in range(500)] != [pair[1].load(i) for i in range(500)]


def test_talk_rejects_bad_input() -> None:
    with pytest.raises(ValueError):
        TalkMix(turn_s=(0.0, 1.0))
    with pytest.raises(ValueError):
        TalkMix(silence=0, turn=0, answer=0)
    with pytest.raises(ValueError):
        Talk(seed=0, period=0.0)
    with pytest.raises(ValueError):
        Talk(seed=0, period=0.08).load(-1)
    with pytest.raises(ValueError):
        FrameLoad(-1)


@pytest.mark.timeout(120)
def test_bench_forecast_command_reports_every_runs_gauge_and_score(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["bench", "forecast", "--quick", "--json", "--runs", "1", "--sessions", "2", "--time-scale", "0.3"]
    assert main([*argv, "--out", str(tmp_path)]) == 0
    report = json.loads(capsys.readouterr().out)
    assert (tmp_path / "forecast.json").is_file()
    assert all(Path(p).is_file() for p in report["plots"])
    for family in ("full", "calm", "window"):
        entry = report[family]
        assert entry["runs"] == 1 and entry["replay_max_diff_s"] == 0.0  # the replay is the engine's gauge
        run = entry["per_run"][0]
        assert run["gauge"]["points"] and set(run["forecast"]) == {"stall_at_s", "leads", "alarm"}
        assert set(entry["by_window"]) == {"1", "2.5", "5", "10", "20"}
    window = report["window"]
    assert window["collapsed"] == 0
    assert all(p[1] is None for p in window["per_run"][0]["gauge"]["points"])  # bounded: never fills
    assert window["live"]["alarm"]["false_alarm_runs"] == 0
    full = report["full"]["per_run"][0]
    assert any(p[1] is not None for p in full["gauge"]["points"])  # unbounded and growing: a finite gauge
