"""``t_sat``: the one formula, in one unit (blocks), and the growth rate it divides by.

The first-order model of the cliff (docs/concepts.md) says a pool with ``free_blocks`` left,
filled by ``N`` sessions each adding ``r`` blocks per second, is full after

    t_sat = free_blocks / (N * r)   seconds.

(As shares of the pool, ``free_blocks = (1 - rho0) * pool_blocks`` and ``r / pool_blocks`` is
each session's share per second: the same number, written ``(1 - rho0) / (N * r)``.)
``r`` is measured, not assumed: the blocks sessions took over the last ``window`` seconds of
ticks divided by the session-seconds in them. A short window follows a change of load
quickly and is noisy (speech and silence, a block taken every few ticks); a long one is
smooth and late. ``metronome bench forecast`` measures the trade-off (docs/alerting.md).

The engine's gauge (``stats().t_sat``, ``metronome_t_sat_seconds``) and the benchmarks both
compute it here, so the number an operator alerts on is the number the benchmark scores.
"""

from __future__ import annotations

from collections import deque

__all__: list[str] = []  # internal: GrowthRate, t_sat


def t_sat(free_blocks: int, sessions: int, blocks_per_second: float) -> float | None:
    """Seconds until ``free_blocks`` are taken by ``sessions`` each adding ``blocks_per_second``.

    ``None`` when nothing fills the pool (no session, or no growth): the pool never fills.
    """
    if sessions <= 0 or blocks_per_second <= 0:
        return None
    return max(0, free_blocks) / (sessions * blocks_per_second)


class GrowthRate:
    """``r``: KV blocks one session adds per second, measured over the last ``window`` seconds of ticks."""

    __slots__ = ("_ticks", "window")

    def __init__(self, window: float) -> None:
        if not window > 0:
            raise ValueError(f"the growth window must be > 0 seconds, got {window!r}")
        self.window = window
        self._ticks: deque[tuple[float, int, int]] = deque()  # (seconds since the tick before, blocks, sessions)

    def observe(self, dt: float, grown_blocks: int, sessions: int) -> None:
        """One tick: ``dt`` seconds after the last, ``sessions`` open, ``grown_blocks`` taken by them."""
        ticks = self._ticks
        ticks.append((dt, grown_blocks, sessions))
        span = sum(t[0] for t in ticks)
        while len(ticks) > 1 and span - ticks[0][0] >= self.window:  # keep at least the window's seconds
            span -= ticks.popleft()[0]

    def rate(self) -> float:
        session_seconds = sum(dt * n for dt, _, n in self._ticks)
        if session_seconds <= 0:
            return 0.0
        return max(0.0, sum(g for _, g, _ in self._ticks) / session_seconds)
