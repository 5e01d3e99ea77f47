"""Every count the engine keeps, kept here once: the engine's totals, the session's, and Prometheus.

One method per event, so an event is counted in one call, never three times in three
places: ``stats()`` reads the totals, ``Session.stats()`` the session's counts, and the
Prometheus registry (``EngineMetrics``) is updated in the same call.

The growth rate ``r`` is measured here too, tick by tick; ``t_sat`` is ``growth.t_sat`` (the
one formula, in blocks) over it.
"""

from __future__ import annotations

import enum
import math
from collections import deque

from metronome_engine import PoolStats

from .._metrics import EngineMetrics
from .._stats import EngineStats
from .admission import Admitter, percentile
from .channel import SessionCounts
from .growth import GrowthRate
from .growth import t_sat as saturation_time
from .state import EngineState

__all__: list[str] = []  # internal: Counters, Fault

_LATENCY_WINDOW = 4096  # frames the latency percentiles in stats() look back over


class Fault(enum.Enum):
    """The kinds of fault counted (the ``kind`` label of ``metronome_faults_total``)."""

    STEP_FAILED = "step_failed"
    STEP_STUCK = "step_stuck"
    STEP_SLOW = "step_slow"  # past the watchdog's limit, within its tokens' measured cost: load was shed
    NUMERIC_FAULT = "numeric_fault"
    SHED = "shed"
    OUTPUT_DROPPED = "output_dropped"
    INPUT_REFUSED = "input_refused"
    ENGINE_FAILED = "engine_failed"


class Counters:
    def __init__(self, metrics: EngineMetrics, *, growth_window: float) -> None:
        self.metrics = metrics
        self.ticks = 0
        self.frames = 0
        self.deadline_misses = 0
        self.stalls = 0
        self.admitted = 0
        self.rejected = 0
        self.step_failures = 0  # step attempts that raised, retried ones included
        self.failed_ticks = 0
        self.failed_in_row = 0
        self.stuck_steps = 0
        self.broken = 0
        self.shed = 0
        self.outputs_dropped = 0
        self.slow_steps = 0
        self.budget_waits = 0  # session-ticks a frame waited because the tick's budget was spent
        self.latencies: deque[float] = deque(maxlen=_LATENCY_WINDOW)
        self._growth = GrowthRate(growth_window)
        self._last_tick_time: float | None = None

    # sessions ------------------------------------------------------------------------------------

    def session_admitted(self, open_sessions: int) -> None:
        self.admitted += 1
        self.metrics.admitted.inc()
        self.metrics.sessions.set(open_sessions)

    def session_rejected(self) -> None:
        self.rejected += 1
        self.metrics.rejected.inc()

    def sessions_open(self, n: int) -> None:
        self.metrics.sessions.set(n)

    # frames --------------------------------------------------------------------------------------

    def frame(self, session: SessionCounts, latency: float, *, missed: bool) -> None:
        session.frames += 1
        self.frames += 1
        self.metrics.frames.inc()
        self.metrics.frame_latency.observe(latency)
        self.latencies.append(latency)
        if missed:
            session.deadline_misses += 1
            self.deadline_misses += 1
            self.metrics.deadline_misses.inc()

    def stall(self, session: SessionCounts) -> None:
        session.stalls += 1
        self.stalls += 1
        self.metrics.stalls.inc()

    def evicted(self, tokens: int) -> None:
        """Conversation tokens the window dropped (the session's own count is its memory's)."""
        self.metrics.evicted_tokens.inc(tokens)

    def output_dropped(self, session: SessionCounts) -> None:
        session.outputs_dropped += 1
        self.fault(Fault.OUTPUT_DROPPED)

    # faults --------------------------------------------------------------------------------------

    def fault(self, kind: Fault, n: int = 1) -> None:
        match kind:
            case Fault.STEP_FAILED:
                self.step_failures += n
            case Fault.STEP_STUCK:
                self.stuck_steps += n
            case Fault.STEP_SLOW:
                self.slow_steps += n
            case Fault.NUMERIC_FAULT:
                self.broken += n
            case Fault.SHED:
                self.shed += n
            case Fault.OUTPUT_DROPPED:
                self.outputs_dropped += n
            case Fault.INPUT_REFUSED | Fault.ENGINE_FAILED:
                pass  # Prometheus only
        self.metrics.faults.labels(kind.value).inc(n)

    def budget_wait(self) -> None:
        self.budget_waits += 1

    def tick_failed(self) -> None:
        self.failed_ticks += 1
        self.failed_in_row += 1

    def tick_succeeded(self) -> None:
        self.failed_in_row = 0

    # ticks and the pool --------------------------------------------------------------------------

    def tick(self, done: float, grown_blocks: int, sessions: int) -> int:
        """Count a tick whose step returned at ``done``; returns its number."""
        if self._last_tick_time is not None:
            self._growth.observe(done - self._last_tick_time, grown_blocks, sessions)
        self._last_tick_time = done
        n = self.ticks
        self.ticks += 1
        return n

    def pool(self, pool: PoolStats) -> None:
        self.metrics.occupancy.set(pool.occupancy)

    def limit(self, limit: int) -> None:
        self.metrics.limit.set(limit)

    def growth_rate(self) -> float:
        """``r``: KV blocks one session adds per second, over the growth window."""
        return self._growth.rate()

    def t_sat(self, pool: PoolStats, sessions: int, *, bounded: bool) -> float | None:
        """The gauge: seconds until the pool is full at the measured growth; ``None``: never."""
        if bounded:
            return None  # bounded sessions: the memory guard keeps the pool from ever filling
        return saturation_time(pool.num_blocks - pool.used_blocks, sessions, self.growth_rate())

    def publish_t_sat(self, t_sat: float | None) -> None:
        self.metrics.t_sat.set(math.inf if t_sat is None else t_sat)

    def latency(self, q: float) -> float | None:
        lat = list(self.latencies)
        return percentile(lat, q) if lat else None

    def snapshot(
        self,
        shared: EngineState | None,
        admitter: Admitter | None,
        *,
        deadline: float,
        initial_limit: int,
        failed: bool,
        tick_tokens: int | None,
    ) -> EngineStats:
        """``Engine.stats()``: these counts beside the pool and the admission cap (``None`` before start)."""
        pool = shared.pool if shared is not None else PoolStats(num_blocks=1, used_blocks=0, block_size=1, sequences=0)
        sessions = len(shared.sessions) if shared is not None else 0
        guard_limit = admitter.guard.limit if admitter is not None and admitter.guard is not None else None
        return EngineStats(
            sessions=sessions,
            limit=admitter.limit if admitter is not None else initial_limit,
            memory_limit=guard_limit,
            admitted=self.admitted,
            rejected=self.rejected,
            pool_blocks=pool.num_blocks if shared is not None else 0,
            used_blocks=pool.used_blocks,
            occupancy=pool.occupancy if shared is not None else 0.0,
            ticks=self.ticks,
            frames=self.frames,
            latency_p50=self.latency(0.5),
            latency_p95=self.latency(0.95),
            latency_p99=self.latency(0.99),
            deadline=deadline,
            deadline_misses=self.deadline_misses,
            stalls=self.stalls,
            growth_rate=self.growth_rate(),
            t_sat=self.t_sat(pool, sessions, bounded=shared is None or shared.session_blocks is not None),
            step_failures=self.step_failures,
            failed_ticks=self.failed_ticks,
            stuck_steps=self.stuck_steps,
            broken=self.broken,
            shed=self.shed,
            outputs_dropped=self.outputs_dropped,
            failed=failed,
            tick_tokens=tick_tokens,
            budget_waits=self.budget_waits,
            slow_steps=self.slow_steps,
            limit_bound_by=admitter.bound_by if admitter is not None else None,
        )
