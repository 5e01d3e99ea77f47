"""``metronome bench cliff | sweep | admit --quick --json`` on the real model: the issue's relations, loosely.

Quick runs are short, so the relations are checked with margins the full runs do not need
(docs/benchmarks.md has the full runs' figures).
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.real_model, pytest.mark.timeout(300)]


def bench(name: str, tmp_path: Path, *extra: str) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "metronome_sdk.cli", "bench", name, "--quick", "--json", "--out", str(tmp_path)]
    done = subprocess.run([*cmd, *extra], capture_output=True, text=True, timeout=280, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    report: dict[str, Any] = json.loads(done.stdout)
    for plot in report["plots"]:
        assert Path(plot).is_file() and Path(plot).stat().st_size > 1000
    return report


def test_cliff_quick(tmp_path: Path) -> None:
    r = bench("cliff", tmp_path)
    full, window = r["full"], r["window"]
    assert full["runs"] == window["runs"] == 8
    assert window["collapsed"] == 0 and window["stalls"] == 0
    assert full["collapsed"] >= 4  # most runs (17 of 20 in the full run)
    # per run, the engine's gauge from the first tick and its forecast scored against the stall
    for run in full["per_run"] + window["per_run"]:
        assert run["gauge"]["points"] and {"stall_at_s", "leads", "alarm"} <= set(run["forecast"])
    alarm = full["forecast"]["alarm"]
    assert alarm["fired_before_collapse"] == alarm["collapses"] == full["collapsed"]
    assert window["forecast"]["alarm"]["false_alarm_runs"] == 0
    assert full["forecast"]["leads"]["1"]["rel_err_median"] < 0.5  # the gauge 1 s out, loosely


def test_cliff_quick_silent_frames_are_empty_and_on_time(tmp_path: Path) -> None:
    r = bench("cliff", tmp_path, "--silent")
    silent = r["full"]["silent"]
    assert r["full"]["collapsed"] >= 2
    assert silent["frames_empty"] > 0
    assert any(Path(p).name == "cliff_silent.png" for p in r["plots"])


def test_sweep_quick(tmp_path: Path) -> None:
    r = bench("sweep", tmp_path)
    deadline = r["deadline_ms"]
    window = r["window"]
    assert [p["n"] for p in window] == [1, 4, 8]
    assert all(p["stalled"] == 0 for p in window)
    # in 11 ticks a full session outgrows the window's bound: 8 of them fill the 8-session pool
    assert r["full"][-1]["n"] == 8 and r["full"][-1]["stalled"] > 0
    assert window[0]["p99_ms"] < deadline  # one session is schedulable
    # p99 rises with N (noise margin: a shared CPU)
    assert all(b["p99_ms"] >= 0.8 * a["p99_ms"] for a, b in itertools.pairwise(window))
    assert window[-1]["p50_ms"] > window[0]["p50_ms"]
    assert isinstance(r["n_sched"], int)


def test_admit_quick(tmp_path: Path) -> None:
    r = bench("admit", tmp_path, "--policy", "model,aimd")
    assert r["config"]["controllers"] == ["model", "aimd"]
    guard = r["config"]["memory_guard_limit"]
    assert r["sweep"]["searched"]
    # the search ends next to a count that misses the deadline (or at its limit)
    n_sched = r["window"]["model"]["n_sched"]
    assert n_sched >= 1 and guard >= 2 * n_sched  # the guard sits above the knee
    misses = [p["n"] for p in r["sweep"]["window"] if p["p99_ms"] > r["sweep"]["deadline_ms"]]
    assert n_sched + 1 in misses or n_sched == 64
    for policy in ("model", "aimd"):
        window, full = r["window"][policy], r["full"][policy]
        assert window["collapsed"] == 0 and window["lost_sessions"] == 0
        assert window["n_sched"] == n_sched and 1 <= window["n_star"] <= guard
        assert full["collapsed"] == full["runs"]  # the same controller under kv=full walks into the wall
