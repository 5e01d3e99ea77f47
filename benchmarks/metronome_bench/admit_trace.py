"""What a run of ``bench admit`` saw: frame latency after it settled, silence, and the cap around a CPU hog."""

from __future__ import annotations

import math
import statistics
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from .workload import FrameRecord, WorkloadTrace

__all__ = ["frames_after", "hog_report", "hogging", "late_frames", "late_report", "silent_frames"]


def hog_report(
    cap: list[tuple[float, int, int]], shed: list[tuple[float, float]], hog: tuple[float, float] | None
) -> dict[str, Any]:
    """What the controller did around the hog: the cap before, during and after, the sheds, the time to react
    and to recover (``None``: the cap never came back within a tenth of where it stood before)."""
    assert hog is not None
    start, end = hog
    before = [c for t, c, _ in cap if start - 5 <= t < start]
    during = [(t, c, n) for t, c, n in cap if start <= t < end]
    after = [c for t, c, _ in cap if t >= end + 10]
    cap0 = before[-1] if before else None
    # admission stops when the cap is at (or below) the sessions open: no newcomer fits
    stopped = next((t - start for t, c, n in during if c <= n), None)
    cut = next((t - start for t, c, _ in during if cap0 is not None and c < cap0), None)
    # recovered: the cap back within a tenth of where it stood before the hog (the knee drifts by that much)
    back = next((t - end for t, c, _ in cap if t >= end and cap0 is not None and c >= 0.9 * cap0), None)
    return {
        "start_s": round(start, 2),
        "end_s": round(end, 2),
        "cap_before": cap0,
        "cap_min_during": min((c for _, c, _ in during), default=None),
        "cap_median_after_10s": round(statistics.median(after)) if after else None,
        "admission_stopped_after_s": None if stopped is None else round(stopped, 2),
        "cap_cut_after_s": None if cut is None else round(cut, 2),
        "recovered_after_s": None if back is None else round(back, 2),
        "shed_during": sum(1 for t, _ in shed if start <= t < end + 5),
        "cap_series": [[round(t, 1), c, n] for t, c, n in _every_second(cap)],
    }


def _every_second(cap: list[tuple[float, int, int]]) -> list[tuple[float, int, int]]:
    """The cap series at one row a second (the last row of each second)."""
    rows: dict[int, tuple[float, int, int]] = {}
    for row in cap:
        rows[int(row[0])] = row
    return [rows[k] for k in sorted(rows)]


@contextmanager
def hogging(procs: int) -> Iterator[None]:
    """``procs`` CPU-bound processes (a busy loop each) for as long as the block runs."""
    busy = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(procs)]
    try:
        yield
    finally:
        for p in busy:
            p.kill()
        for p in busy:
            p.wait()


def frames_after(trace: WorkloadTrace, settle: float, deadline: float) -> tuple[float | None, int, int]:
    """p99 (ms) of the frames sent after ``settle`` seconds, their count, how many late. Left out: shed sessions'
    frames, and frames still in flight when the run ended (sent in its last two periods, not answered)."""
    frames = _judged(trace, settle, deadline)
    waited = [trace.waited(f) for f in frames]
    if not waited:
        return None, 0, 0
    late = sum(1 for f in frames if _late(trace, f, deadline))
    p99 = sorted(waited)[max(1, math.ceil(0.99 * len(waited))) - 1]  # nearest rank, as the sweep's
    return round(p99 * 1e3, 2), len(frames), late


def late_frames(trace: WorkloadTrace, settle: float, deadline: float) -> list[FrameRecord]:
    """The frames ``frames_after`` counts late: answered past the deadline, dropped by their client, failed."""
    return [f for f in _judged(trace, settle, deadline) if _late(trace, f, deadline)]


def late_report(trace: WorkloadTrace, settle: float, deadline: float) -> dict[str, Any]:
    """Why and when frames were late: counts by outcome (``ok``: answered, past the deadline) and by the
    second of the run they were sent in; beside them the ticks after ``settle`` whose step alone took the
    deadline, and those where a session's tokens waited on the tick's budget (its frame a period late)."""
    late = late_frames(trace, settle, deadline)
    ticks = [t for t in trace.ticks if t.time - trace.start >= settle]
    return {
        "ticks": len(ticks),
        "steps_over_deadline": sum(1 for t in ticks if t.step_seconds > deadline),
        "budget_waits": sum(1 for t in ticks if t.waiting),
        "by_outcome": dict(sorted(Counter(f.outcome for f in late).items())),
        "by_second": {str(k): v for k, v in sorted(Counter(int(f.sent - trace.start) for f in late).items())},
    }


def _late(trace: WorkloadTrace, f: FrameRecord, deadline: float) -> bool:
    return f.outcome not in ("ok", "empty") or trace.waited(f) > deadline


def _judged(trace: WorkloadTrace, settle: float, deadline: float) -> list[FrameRecord]:
    cutoff = trace.end - 2 * deadline  # the deadline is the period: the frames of the last two are in flight
    return [
        f
        for f in trace.frames
        if f.sent - trace.start >= settle and f.outcome != "shed" and (f.outcome != "unanswered" or f.sent < cutoff)
    ]


def silent_frames(trace: WorkloadTrace, period: float) -> tuple[int, int]:
    """Frames answered with silence or never answered without a typed error, and the sessions they belong to.

    A frame still in flight when the run ended (sent in its last two periods) is not counted."""
    shed = {r.plan.index for r in trace.sessions if r.shed is not None}
    silent = [
        f
        for f in trace.frames
        if f.outcome == "empty" or (f.outcome == "unanswered" and f.sent < trace.end - 2 * period)
    ]
    lost = {f.session for f in silent if f.session not in shed}
    return len(silent), len(lost)
