"""Model-based admission: predict the tick at N+1 sessions from the measured step cost.

Calls last minutes, so a cap acts only on newcomers and a session's cost keeps arriving long
after its admission: AIMD on latency alone overshoots while that cost is on its way and then
cuts far below the load it reacts to, which stays (issue 33). This policy admits from a model
instead: a step appending ``tokens`` takes ``StepCost.seconds(tokens)`` (fixed + per token,
refitted by the tick loop from every step), times ``slowdown``: the median ratio of measured to
predicted seconds over the last three steps (another process on a core shows here within two
ticks, long before the refit's window has moved), or over the last sixteen when that is higher.
A session admitted stays for minutes, so the cap grows only on what the steps have shown for a
while, never on a brief dip; it falls on the first two slow steps. Each session in flight, measured or not, counts at
``session_tokens`` a tick. Feedback keeps two terms the model cannot know: ``overhead``, what a
frame waits at the percentile beyond the median step (the send lead, jitter), and
``correction``, AIMD on the model's own misses. Ideas kept from Netflix's concurrency-limits
(Gradient2, Vegas) and Envoy's adaptive concurrency are in docs/sessions.md.

A second signal (the callers' voice-to-voice latency) feeds the same cap through
``constrain(name, limit)``: the cap is the least of the model's and every named limit.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import deque
from collections.abc import Callable

from .._config import AdmissionConfig
from .admission import Admitter, MemoryGuard, percentile
from .cost import StepCost

__all__: list[str] = []  # internal: ModelAdmitter (AdmissionConfig(policy="model"))

SLOWDOWN_STEPS = 3  # steps whose median measured/predicted ratio stops admission: one odd step moves nothing
SETTLED_STEPS = 16  # steps whose median ratio growth waits for: a brief dip admits no session that stays
OVERHEAD_WEIGHT = 0.3  # each decision's weight in the overhead's moving average (a p99 of a few dozen frames)
CORRECTION_MAX = 4.0  # the model's cost is never scaled past this: past it the model is wrong, not noisy
CORRECTION_RELAX = 0.02  # each decision that meets the target takes this much off the correction (additive)
MISSES_TO_SHED = 2  # decisions in a row past the deadline before any session is shed: one late second sheds nobody


class ModelAdmitter(Admitter):
    """The cap from a model of the next tick, with AIMD on what the model misses.

    ``budget`` gives the tick's token budget now (``None``: no budget): the model never admits
    sessions whose tokens the least budget of the last sixteen ticks would hold back a tick.
    ``update`` runs once a tick; a decision (every ``interval`` seconds, after ``min_samples``
    frames) learns the overhead and the correction, and sheds when the deadline itself is still
    missed at the next decision.
    """

    def __init__(
        self,
        config: AdmissionConfig | None = None,
        *,
        deadline: float,
        cost: StepCost,
        budget: Callable[[], int | None] = lambda: None,
        guard: MemoryGuard | None = None,
        clock: Callable[[], float] = time.monotonic,
        measured: int | None = None,
    ) -> None:
        super().__init__(config, deadline=deadline, guard=guard, clock=clock, measured=measured)
        self.cost = cost
        self._budget = budget
        self._ratios: deque[float] = deque(maxlen=SETTLED_STEPS)
        self._budgets: deque[int] = deque(maxlen=SETTLED_STEPS)  # the tick budget at each update
        self._steps: list[float] = []  # step seconds since the last decision
        self.overhead = 0.0  # seconds a frame waits at the percentile beyond its step (learned)
        self.correction = 1.0  # the model's cost scale: AIMD on its misses
        self._in_flight = 0
        self._shed = 0
        self._misses = 0  # decisions in a row whose percentile missed the deadline itself
        self._limits: dict[str, int] = {}
        self._learned = False  # whether a decision has measured the overhead yet
        self._bound_by = "start"  # what set the cap at the last update (see ``bound_by``)

    @property
    def slowdown(self) -> float:
        """Measured over predicted seconds: the higher of the last 3 steps' median and the last 16's.

        1.0 before any step. The short median cuts at once when the machine slows; the long
        one holds the cap while a few fast steps pass, and lets it grow once they last.
        """
        if not self._ratios:
            return 1.0
        recent = list(self._ratios)[-SLOWDOWN_STEPS:]
        return max(statistics.median(recent), statistics.median(self._ratios))

    def observe_step(self, tokens: int, seconds: float) -> None:
        if self.cost.ready and tokens >= 1:
            predicted = self.cost.seconds(tokens)
            if predicted > 0:
                self._ratios.append(seconds / predicted)
        self._steps.append(seconds)

    def constrain(self, name: str, limit: int | None) -> None:
        """Cap admission at ``limit`` sessions for signal ``name`` (``None`` lifts it)."""
        if limit is None:
            self._limits.pop(name, None)
        else:
            self._limits[name] = limit

    def predicted(self, sessions: int) -> float | None:
        """Predicted frame latency (seconds, at the percentile) with ``sessions`` in flight."""
        if not self.cost.ready:
            return None
        step = self.cost.seconds(sessions * self.config.session_tokens)
        return self.overhead + self.correction * self.slowdown * step

    @property
    def bound_by(self) -> str:
        """What set the cap at the last update: ``"model"`` (the predicted tick), ``"budget"`` (the
        least tick budget of the last ticks), ``"burst"`` (sqrt(N) ahead of those in flight),
        ``"running"`` (never below what runs), ``"memory"``, ``"max_limit"``, ``"min_limit"``, a
        ``constrain`` name, ``"slow_step"`` (the watchdog's cut), ``"start"`` (nothing measured yet).
        A cap held below the knee for long says here which term to look at."""
        return self._bound_by

    def fits(self) -> int | None:
        """Most sessions the model says a tick holds under the threshold (``None``: no model yet)."""
        fit = self._fit()
        return None if fit is None else fit[0]

    def _fit(self) -> tuple[int, str] | None:
        """``fits()``, and which term gave it: the model, the budget, or a ``constrain`` name."""
        if not self.cost.ready:
            return None
        per = self.config.session_tokens
        room = (self.threshold - self.overhead) / (self.correction * self.slowdown)
        terms = [(self.cost.tokens_within(room) // per if room > 0 else 0, "model")]
        budget = self._budget()
        if budget is not None:
            # the least budget of the last steps: the budget follows the refitted cost, and a session
            # let in on a brief high would wait a tick (a late frame) each time it fell back
            terms.append((min([budget, *self._budgets]) // per, "budget"))
        terms += [(limit, name) for name, limit in self._limits.items()]
        return min(terms, key=lambda term: term[0])  # a tie names the first: the model, then the budget

    def to_shed(self) -> int:
        shed, self._shed = self._shed, 0
        return shed

    def cut(self) -> int:
        """The watchdog saw a slow step: admit nobody until the next tick's model says otherwise."""
        self._limit = self._clamp(self._in_flight)
        self._bound_by = "slow_step"
        return self._limit

    def update(self, in_flight: int) -> int:
        c = self.config
        self._in_flight = in_flight
        self._peak = max(self._peak, in_flight)
        budget = self._budget()
        if budget is not None:
            self._budgets.append(budget)
        now = self._clock()
        if now >= self._next_decision and len(self._samples) >= c.min_samples:
            self._decide(in_flight, now)
        fit = self._fit()
        if fit is None:
            return self._limit  # nothing measured yet: the starting cap holds
        cap, by = fit
        # admit at most sqrt(N) ahead of the sessions in flight between two ticks (Gradient2's queue
        # allowance): the model's extrapolation past what it measured is never trusted for a burst
        burst = in_flight + max(1, math.isqrt(max(1, in_flight)))
        if burst < cap:
            cap, by = burst, "burst"
        # never below what runs (less the sessions being shed): a lower cap only refuses newcomers
        if in_flight - self._shed > cap:
            cap, by = in_flight - self._shed, "running"
        self._limit, clamped = self._clamp_by(cap)
        self._bound_by = clamped or by
        return self._limit

    def _decide(self, in_flight: int, now: float) -> None:
        c = self.config
        high = percentile(self._samples, c.percentile)
        expected = self.predicted(self._peak)
        if self._steps:
            seen = max(0.0, high - statistics.median(self._steps))
            weight = OVERHEAD_WEIGHT if self._learned else 1.0  # the first decision's measurement as it is
            self.overhead += weight * (seen - self.overhead)
            self._learned = True
        self._misses = self._misses + 1 if high > self.deadline else 0
        if high > self.threshold:
            if expected is not None and expected <= self.threshold:
                # a miss the model did not predict: its cost is scaled up, multiplicatively
                self.correction = min(CORRECTION_MAX, self.correction / c.decrease)
            fit = self.fits()
            if self._misses >= MISSES_TO_SHED and fit is not None and fit < in_flight and in_flight > 1:
                # the deadline is still missed a decision after admission stopped: shed the newest, a share
                # at a time (one late second, a stall the machine had once, sheds nobody)
                share = max(1, math.ceil(in_flight * (1 - c.decrease)))
                self._shed = min(in_flight - max(fit, 1), share)
        else:
            self.correction = max(1.0, self.correction - CORRECTION_RELAX)
        self._samples.clear()
        self._steps.clear()
        self._peak = in_flight
        self._rejected = 0
        self._next_decision = now + c.interval

    def __repr__(self) -> str:
        return (
            f"ModelAdmitter(limit={self._limit}, threshold={self.threshold:.4f}s, slowdown={self.slowdown:.2f}, "
            f"overhead={self.overhead * 1e3:.1f} ms, correction={self.correction:.2f}, bound_by={self._bound_by!r}, "
            f"guard={self.guard!r})"
        )
