"""When sessions arrive and how long they stay: seeded, so a run is repeatable."""

from __future__ import annotations

import random
from dataclasses import dataclass

__all__ = ["SessionPlan", "plan_arrivals", "plan_sessions"]


@dataclass(frozen=True, slots=True)
class SessionPlan:
    index: int
    arrival: float  # seconds from the start of the run
    duration: float  # seconds of streaming


def plan_sessions(n: int, *, seed: int, arrival_spread: float, duration: tuple[float, float]) -> list[SessionPlan]:
    """``n`` sessions arriving uniformly in ``[0, arrival_spread)``, each lasting uniformly in ``duration``."""
    if n < 1:
        raise ValueError(f"n must be >= 1 session, got {n}")
    lo, hi = duration
    if not 0 < lo <= hi:
        raise ValueError(f"duration must be (lo, hi) with 0 < lo <= hi seconds, got {duration}")
    rng = random.Random(seed)
    plans = [SessionPlan(i, rng.uniform(0.0, arrival_spread), rng.uniform(lo, hi)) for i in range(n)]
    return sorted(plans, key=lambda p: p.arrival)


def plan_arrivals(
    *, rate: float, horizon: float, seed: int, duration: tuple[float, float], first: int = 0
) -> list[SessionPlan]:
    """Poisson arrivals at ``rate`` per second until ``horizon``, after ``first`` sessions at time 0."""
    if rate <= 0:
        raise ValueError(f"rate must be > 0 sessions per second, got {rate}")
    rng = random.Random(seed)
    lo, hi = duration
    plans = [SessionPlan(i, 0.0, rng.uniform(lo, hi)) for i in range(first)]
    t = rng.expovariate(rate)
    while t < horizon:
        plans.append(SessionPlan(len(plans), t, rng.uniform(lo, hi)))
        t += rng.expovariate(rate)
    return plans
