"""Scoring the live ``t_sat`` gauge as a forecast: what it said, read against the collapse that came.

The gauge is recorded at every tick from the start of a run (``TickReport.t_sat``, the value
``engine.stats().t_sat`` and ``metronome_t_sat_seconds`` held after that tick). After the run:

- for each lead time ``L`` before the first stall, the gauge at that instant (the last tick at
  or before ``stall - L``) against the truth, the seconds that were really left then
  (``stall - tick``): relative error ``|gauge - truth| / truth``. A gauge that said "never"
  (``None``) there is a miss, scored as an infinite error. A run that collapsed sooner than
  ``L`` after its first tick has no score at that lead.
- the alarm ``t_sat < A``: when it first fired, how early before the stall, and, in runs that
  never collapsed, whether it fired at all (a false alarm) and how often.

No instant is chosen knowing the outcome except the lead itself, which is what a forecast's
lead is. Pure functions on plain values, so they are tested on made-up series.
"""

from __future__ import annotations

import bisect
import itertools
import math
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from metronome_sdk.estimators import GrowthRate
from metronome_sdk.estimators import t_sat as saturation_time

__all__ = [
    "GAUGE_COLUMNS",
    "gauge_rows",
    "ALARM_S",
    "LEADS",
    "Alarm",
    "ForecastScore",
    "GaugePoint",
    "LeadScore",
    "alarm",
    "gauge_series",
    "replay",
    "score",
    "summarize_scores",
]

LEADS: tuple[float, ...] = (1.0, 2.0, 5.0, 10.0, 20.0)
ALARM_S = 10.0  # the alarm the docs recommend: t_sat under 10 s


class TickLike(Protocol):
    """What the scoring reads of a ``TickReport``."""

    @property
    def time(self) -> float: ...
    @property
    def sessions(self) -> int: ...
    @property
    def used_blocks(self) -> int: ...
    @property
    def pool_blocks(self) -> int: ...
    @property
    def grown_blocks(self) -> int: ...
    @property
    def t_sat(self) -> float | None: ...


@dataclass(frozen=True, slots=True)
class GaugePoint:
    time: float  # seconds into the run
    t_sat: float | None  # what the gauge said (None: the pool will not fill)
    sessions: int = 0
    occupancy: float = 0.0


def gauge_series(ticks: Iterable[TickLike], start: float) -> list[GaugePoint]:
    """The gauge as the engine published it, tick by tick, with times relative to ``start``."""
    return [GaugePoint(t.time - start, t.t_sat, t.sessions, t.used_blocks / t.pool_blocks) for t in ticks]


GAUGE_COLUMNS = ["t_s", "t_sat_s", "sessions", "occupancy"]


def gauge_rows(series: Sequence[GaugePoint]) -> list[list[float | int | None]]:
    """The series as JSON rows, one per point, in the order of ``GAUGE_COLUMNS``."""
    return [
        [round(p.time, 3), None if p.t_sat is None else round(p.t_sat, 3), p.sessions, round(p.occupancy, 4)]
        for p in series
    ]


def replay(ticks: Sequence[TickLike], start: float, *, window: float, bounded: bool = False) -> list[GaugePoint]:
    """The gauge the engine would have published with a growth window of ``window`` seconds.

    The same estimator and formula as the engine's (``_growth``), fed the same ticks: at the
    engine's own window it reproduces the live series exactly.
    """
    rate = GrowthRate(window)
    out: list[GaugePoint] = []
    last: float | None = None
    for t in ticks:
        if last is not None:
            rate.observe(t.time - last, t.grown_blocks, t.sessions)
        last = t.time
        value = None if bounded else saturation_time(t.pool_blocks - t.used_blocks, t.sessions, rate.rate())
        out.append(GaugePoint(t.time - start, value, t.sessions, t.used_blocks / t.pool_blocks))
    return out


@dataclass(frozen=True, slots=True)
class LeadScore:
    lead: float  # seconds before the stall asked for
    at: float  # the tick read: the last at or before stall - lead
    gauge: float | None
    truth: float  # seconds from that tick to the stall

    @property
    def rel_err(self) -> float:
        if self.gauge is None:
            return math.inf
        return abs(self.gauge - self.truth) / self.truth


@dataclass(frozen=True, slots=True)
class Alarm:
    threshold: float
    first: float | None  # seconds into the run it first fired (None: never)
    episodes: int  # times it went from clear to firing
    seconds: float  # time spent firing


@dataclass(frozen=True, slots=True)
class ForecastScore:
    stall_at: float | None  # seconds into the run of the first stall (None: never collapsed)
    leads: dict[float, LeadScore | None]
    alarm: Alarm  # before the stall in a collapsed run; over the whole run otherwise

    @property
    def collapsed(self) -> bool:
        return self.stall_at is not None

    @property
    def alarm_lead(self) -> float | None:
        """Seconds from the alarm's first firing to the stall (None: it did not fire before it)."""
        if self.stall_at is None or self.alarm.first is None:
            return None
        return self.stall_at - self.alarm.first

    @property
    def false_alarm(self) -> bool:
        return self.stall_at is None and self.alarm.first is not None

    def as_dict(self) -> dict[str, Any]:
        return {
            "stall_at_s": _r(self.stall_at),
            "leads": {
                _lead_key(lead): None
                if s is None
                else {
                    "at_s": _r(s.at),
                    "gauge_s": _r(s.gauge),
                    "truth_s": _r(s.truth),
                    "rel_err": None if math.isinf(s.rel_err) else _r(s.rel_err),
                }
                for lead, s in self.leads.items()
            },
            "alarm": {
                "threshold_s": self.alarm.threshold,
                "first_s": _r(self.alarm.first),
                "lead_s": _r(self.alarm_lead),
                "episodes": self.alarm.episodes,
                "seconds": _r(self.alarm.seconds),
                "false_alarm": self.false_alarm,
            },
        }


def _r(x: float | None) -> float | None:
    return None if x is None else round(x, 4)


def _lead_key(lead: float) -> str:
    return f"{lead:g}"


def gauge_at(series: Sequence[GaugePoint], t: float) -> GaugePoint | None:
    """The last point at or before ``t`` (``None``: ``t`` is before the first)."""
    i = bisect.bisect_right([p.time for p in series], t)
    return series[i - 1] if i > 0 else None


def alarm(series: Sequence[GaugePoint], threshold: float, *, until: float | None = None) -> Alarm:
    """The alarm ``t_sat < threshold`` over ``series`` (before ``until``, when given)."""
    if not threshold > 0:
        raise ValueError(f"the alarm threshold must be > 0 seconds, got {threshold!r}")
    first: float | None = None
    episodes, seconds, firing, since = 0, 0.0, False, 0.0
    for p in series:
        if until is not None and p.time >= until:
            break
        now = p.t_sat is not None and p.t_sat < threshold
        if now and not firing:
            episodes += 1
            since = p.time
            if first is None:
                first = p.time
        elif firing and not now:
            seconds += p.time - since
        firing = now
    if firing:
        end = until if until is not None else series[-1].time
        seconds += end - since
    return Alarm(threshold, first, episodes, seconds)


def score(
    series: Sequence[GaugePoint],
    stall_at: float | None,
    *,
    leads: Sequence[float] = LEADS,
    threshold: float = ALARM_S,
) -> ForecastScore:
    """The series scored against the run's first stall (``stall_at``, or ``None`` if it never came)."""
    if any(b.time < a.time for a, b in itertools.pairwise(series)):
        raise ValueError("the gauge series must be in time order")
    scored: dict[float, LeadScore | None] = {}
    for lead in leads:
        if not lead > 0:
            raise ValueError(f"lead times must be > 0 seconds, got {lead!r}")
        point = None if stall_at is None else gauge_at(series, stall_at - lead)
        if stall_at is None or point is None:
            scored[lead] = None
        else:
            scored[lead] = LeadScore(lead, point.time, point.t_sat, stall_at - point.time)
    return ForecastScore(stall_at, scored, alarm(series, threshold, until=stall_at))


def summarize_scores(scores: Sequence[ForecastScore]) -> dict[str, Any]:
    """Over runs: per lead the relative errors' median and 90th percentile; the alarm's record."""
    per_lead: dict[str, Any] = {}
    leads = sorted({lead for s in scores for lead in s.leads})
    for lead in leads:
        errs = [ls.rel_err for s in scores if (ls := s.leads.get(lead)) is not None]
        per_lead[_lead_key(lead)] = {
            "runs": len(errs),
            "misses": sum(1 for e in errs if math.isinf(e)),  # the gauge said "never"
            "rel_err_median": _finite(statistics.median(errs)) if errs else None,
            "rel_err_p90": _finite(_quantile(errs, 0.9)) if errs else None,
        }
    collapsed = [s for s in scores if s.collapsed]
    calm = [s for s in scores if not s.collapsed]
    leads_s = [early for s in collapsed if (early := s.alarm_lead) is not None]
    return {
        "leads": per_lead,
        "alarm": {
            "threshold_s": scores[0].alarm.threshold if scores else ALARM_S,
            "collapses": len(collapsed),
            "fired_before_collapse": len(leads_s),
            "lead_s_min": _r(min(leads_s)) if leads_s else None,
            "lead_s_median": _r(statistics.median(leads_s)) if leads_s else None,
            "runs_without_collapse": len(calm),
            "false_alarm_runs": sum(s.false_alarm for s in calm),
            "false_alarm_episodes": sum(s.alarm.episodes for s in calm),
        },
    }


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


def _finite(x: float) -> float | None:
    """JSON has no infinity: a median that is a miss is reported as null (see ``misses``)."""
    return None if math.isinf(x) else round(x, 4)
