"""Admission: a session cap on per-frame latency, under a memory guard. Pure Python, no engine.

Two policies share ``Admitter``: the paper's AIMD cap (``AIMDAdmitter``, here) finds the
schedulable concurrency from latency alone; the model-based cap (``model_admission.ModelAdmitter``)
predicts the next tick from the measured step cost. The memory guard
caps it at what the block pool can hold if every admitted session reaches its bound.
The clock is injected so tests drive time by hand.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable

from .._config import AdmissionConfig

__all__: list[str] = []  # internal: Admitter, AIMDAdmitter, MemoryGuard (configured through AdmissionConfig)

UNMEASURED_LIMIT = 4  # a cap that is safe on a small CPU, for an engine that measured nothing


def percentile(samples: Iterable[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in ``(0, 1]``) of a non-empty collection."""
    ordered = sorted(samples)
    if not ordered:
        raise ValueError("percentile of no samples; measure at least one frame first")
    rank = max(1, math.ceil(q * len(ordered)))
    return ordered[rank - 1]


class MemoryGuard:
    """Admit a session only if the pool can hold every admitted session's bound.

    ``session_blocks`` is one session's bounded footprint; ``None`` (the full policy)
    means no bound exists, so the guard can only check that a block is free *now*: it
    cannot see the growth that will fill the pool later. A session that pins its system
    prompt holds more than that: ``admits`` counts those extra blocks too.
    """

    __slots__ = ("pool_blocks", "session_blocks")

    def __init__(self, *, pool_blocks: int, session_blocks: int | None) -> None:
        if pool_blocks < 1:
            raise ValueError(f"pool_blocks must be >= 1, got {pool_blocks}")
        if session_blocks is not None and session_blocks < 1:
            raise ValueError(f"session_blocks must be >= 1 or None (unbounded), got {session_blocks}")
        self.pool_blocks = pool_blocks
        self.session_blocks = session_blocks

    @property
    def limit(self) -> int | None:
        """Most sessions whose bounds fit in the pool together (``None``: unbounded policy)."""
        if self.session_blocks is None:
            return None
        return self.pool_blocks // self.session_blocks

    def admits(self, admitted: int, *, free_blocks: int, pinned_blocks: int = 0) -> bool:
        """Whether one more session fits; ``pinned_blocks``: what the admitted sessions and
        the new one pin beyond ``session_blocks`` each (their pinned prompts)."""
        if self.session_blocks is None:
            return free_blocks > 0
        return (admitted + 1) * self.session_blocks + pinned_blocks <= self.pool_blocks

    def __repr__(self) -> str:
        return f"MemoryGuard(pool_blocks={self.pool_blocks}, session_blocks={self.session_blocks}, limit={self.limit})"


class Admitter:
    """What every admission policy shares: the cap, the memory guard, the door and the clock.

    The engine feeds a policy every frame's latency (``observe``) and every step's cost
    (``observe_step``), calls ``update`` once a tick with the sessions in flight, and sheds
    ``to_shed()`` of the newest sessions after it. ``admits`` answers whether one more
    session may open now. Subclasses decide how the cap moves (``update``, ``cut``).
    """

    def __init__(
        self,
        config: AdmissionConfig | None = None,
        *,
        deadline: float,
        guard: MemoryGuard | None = None,
        clock: Callable[[], float] = time.monotonic,
        measured: int | None = None,
    ) -> None:
        if not deadline > 0:
            raise ValueError(f"deadline must be > 0 seconds, got {deadline!r}")
        self.config = config or AdmissionConfig()
        self.deadline = deadline
        self.guard = guard
        self._clock = clock
        # an explicit initial_limit wins; else the sessions the calibration says a tick holds
        start = self.config.initial_limit if self.config.initial_limit is not None else measured
        self._limit = self._clamp(start if start is not None else UNMEASURED_LIMIT)
        self._samples: list[float] = []
        self._peak = 0  # most sessions in flight since the last decision
        self._rejected = 0  # opens refused since the last decision: demand the cap did not see
        self._next_decision = clock() + self.config.interval

    @property
    def limit(self) -> int:
        """The cap now, never above the memory guard's."""
        return self._limit

    @property
    def threshold(self) -> float:
        """The latency (seconds) the high percentile must stay under."""
        return self.config.target * self.deadline

    @property
    def bound_by(self) -> str | None:
        """What set the cap at the last update (``EngineStats.limit_bound_by``); ``None``: the policy's own feedback."""
        return None

    def _clamp(self, limit: int) -> int:
        return self._clamp_by(limit)[0]

    def _clamp_by(self, limit: int) -> tuple[int, str | None]:
        """``limit`` within ``min_limit``, ``max_limit`` and the memory guard, and which moved it (``None``: none)."""
        c = self.config
        by = None
        if limit > c.max_limit:
            limit, by = c.max_limit, "max_limit"
        if limit < c.min_limit:
            limit, by = c.min_limit, "min_limit"
        guard_limit = self.guard.limit if self.guard is not None else None
        if guard_limit is not None and guard_limit < limit:
            limit, by = guard_limit, "memory"
        return limit, by

    def observe(self, latency: float) -> None:
        self._samples.append(latency)

    def observe_step(self, tokens: int, seconds: float) -> None:
        """One measured step, before the step-cost model learns from it (AIMD does not look)."""

    def to_shed(self) -> int:
        """How many of the newest sessions to shed now, after ``update`` (AIMD sheds none)."""
        return 0

    def admits(self, in_flight: int, *, free_blocks: int = 1, pinned_blocks: int = 0) -> bool:
        """Whether one more session may open with ``in_flight`` already admitted
        (``pinned_blocks``: see ``MemoryGuard.admits``)."""
        self._peak = max(self._peak, in_flight)
        if in_flight >= self._limit:
            return False
        return self.guard is None or self.guard.admits(in_flight, free_blocks=free_blocks, pinned_blocks=pinned_blocks)

    def record_rejection(self) -> None:
        self._rejected += 1

    def retry_after(self) -> float:
        """Seconds until the cap may next change (at least a tenth of an interval)."""
        return max(self._next_decision - self._clock(), self.config.interval / 10)

    def cut(self) -> int:
        """Decrease now, without waiting for a decision: a step ran long (the watchdog's slow verdict)."""
        raise NotImplementedError

    def update(self, in_flight: int) -> int:
        """Decide if a decision is due; return the cap (changed or not)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}(limit={self._limit}, threshold={self.threshold:.4f}s, guard={self.guard!r})"


class AIMDAdmitter(Admitter):
    """The session cap, moved by additive increase / multiplicative decrease on latency.

    Feed it every frame's latency (``observe``) and call ``update`` once a tick with the
    sessions in flight; it decides at most once per ``config.interval`` seconds.
    The cap starts at ``config.initial_limit``, or when that is ``None`` at ``measured``
    (the sessions the engine's calibration says a tick holds), or at 4 when nothing was
    measured. A cut acts only on newcomers: sessions already admitted stay to their end.
    """

    def cut(self) -> int:
        """Decrease now, without waiting for a decision: a step ran long (the watchdog's slow verdict)."""
        c = self.config
        self._limit = self._clamp(min(self._limit - 1, math.floor(self._limit * c.decrease)))
        self._samples.clear()
        self._next_decision = self._clock() + c.interval
        return self._limit

    def update(self, in_flight: int) -> int:
        """Decide if a decision is due; return the cap (changed or not)."""
        c = self.config
        self._peak = max(self._peak, in_flight)
        now = self._clock()
        if now < self._next_decision or len(self._samples) < c.min_samples:
            return self._limit  # too early, or too few frames to judge: keep the cap
        high = percentile(self._samples, c.percentile)
        if high > self.threshold:
            self._limit = self._clamp(min(self._limit - 1, math.floor(self._limit * c.decrease)))
        elif self._peak + self._rejected >= self._limit:
            # grow only under demand: an idle cap that grew would admit a burst it never measured
            self._limit = self._clamp(self._limit + c.increase)
        # the next decision judges latency measured at the new cap only
        self._samples.clear()
        self._peak = in_flight
        self._rejected = 0
        self._next_decision = now + c.interval
        return self._limit
