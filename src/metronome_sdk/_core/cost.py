"""What a step costs on this machine: seconds = fixed + per_token x tokens.

Fitted by least squares to a short calibration at engine start (``calibrate``: a few real
steps, timed, through the backend's interface), then refitted from the steps the engine
measures, so the budget follows the machine (another process taking a
core, a slower path). The calibration's points are kept in every fit: steady decode
ticks all carry about the same number of tokens, which alone cannot separate the fixed
cost (reading the weights) from the cost per token.
"""

from __future__ import annotations

import math
import time
from collections import deque
from collections.abc import Callable, Iterable

from metronome_engine import EngineBackend, StepRequest

__all__: list[str] = []  # internal: StepCost, calibrate

_MIN_PER_TOKEN = 1e-6  # seconds: a fit never claims tokens are free
_ROUNDING = 1e-9  # tokens: a fit's float error must not cost a whole token


class StepCost:
    """A linear model of step seconds against the tokens the step appends."""

    def __init__(self, calibration: Iterable[tuple[int, float]] = (), *, window: int = 64) -> None:
        if window < 1:
            raise ValueError(f"window must be >= 1 step, got {window}")
        self._prior = [self._check(t, s) for t, s in calibration]
        self._recent: deque[tuple[int, float]] = deque(maxlen=window)
        self.fixed = 0.0
        self.per_token = 0.0
        self._fit()

    @staticmethod
    def _check(tokens: int, seconds: float) -> tuple[int, float]:
        if tokens < 1 or not (math.isfinite(seconds) and seconds >= 0):
            raise ValueError(f"a step sample needs tokens >= 1 and finite seconds >= 0, got ({tokens}, {seconds})")
        return tokens, seconds

    @property
    def ready(self) -> bool:
        """Whether the samples span two token counts: enough to tell fixed cost from per-token cost."""
        return len({t for t, _ in self.samples}) >= 2

    @property
    def samples(self) -> list[tuple[int, float]]:
        return [*self._prior, *self._recent]

    def observe(self, tokens: int, seconds: float) -> None:
        """One measured step: ``tokens`` appended in ``seconds``."""
        self._recent.append(self._check(tokens, seconds))
        self._fit()

    def _fit(self) -> None:
        pts = self.samples
        if not pts:
            return
        n = len(pts)
        mt = sum(t for t, _ in pts) / n
        ms = sum(s for _, s in pts) / n
        var = sum((t - mt) ** 2 for t, _ in pts)
        slope = sum((t - mt) * (s - ms) for t, s in pts) / var if var > 0 else 0.0
        fixed = ms - slope * mt
        if slope < _MIN_PER_TOKEN or fixed < 0:
            # noise bent the line: fall back to cost proportional to tokens, through the origin
            fixed, slope = 0.0, max(_MIN_PER_TOKEN, sum(s for _, s in pts) / sum(t for t, _ in pts))
        self.fixed, self.per_token = fixed, slope

    def seconds(self, tokens: int) -> float:
        """Predicted seconds of a step appending ``tokens``."""
        return self.fixed + self.per_token * tokens

    def slowest(self) -> float:
        """The largest ratio of measured to predicted seconds seen: how far a step may run past its prediction."""
        ratios = [s / self.seconds(t) for t, s in self.samples if self.seconds(t) > 0]
        return max([1.0, *ratios])

    def tokens_within(self, seconds: float) -> int:
        """Most tokens one step appends within ``seconds`` (0 when even the fixed cost does not fit)."""
        if seconds <= self.fixed:
            return 0
        return int((seconds - self.fixed) / self.per_token + _ROUNDING)

    def step_tokens(self) -> int:
        """The fixed cost of one more step, in tokens: what an extra decode round costs beyond its own tokens."""
        return math.ceil(self.fixed / self.per_token - _ROUNDING)

    def __repr__(self) -> str:
        fixed, per_token = self.fixed * 1e3, self.per_token * 1e3
        return f"StepCost(fixed={fixed:.2f} ms, per_token={per_token:.3f} ms, samples={len(self.samples)})"


# the calibration at engine start -----------------------------------------------------------------


def calibrate(
    core: EngineBackend,
    *,
    chunk: int,
    sessions: int = 8,
    repeats: int = 2,
    clock: Callable[[], float] = time.perf_counter,
) -> list[tuple[int, float]]:
    """``(tokens, seconds)`` of each timed step; the first step (warm-up) is not among them.

    Runs on the engine's core thread before any session opens: it opens a few throwaway
    sequences, times decode steps at batch 1 and at batch ``sessions`` and a prefill chunk of
    ``chunk`` tokens, and frees them (about eight steps, a second on a small CPU). Any
    ``EngineBackend`` works; a backend whose pool cannot hold the sequences gives fewer points
    (a stalled step is skipped, never counted).
    """
    vocab = core.config.vocab_size
    seqs: list[int] = []
    samples: list[tuple[int, float]] = []

    def timed(sizes: list[int]) -> None:
        pairs = zip(seqs[: len(sizes)], sizes, strict=True)
        reqs = [StepRequest(sid, [(7 * i + j) % vocab for j in range(n)]) for i, (sid, n) in enumerate(pairs)]
        t0 = clock()
        outs = core.step(reqs)
        seconds = clock() - t0
        if all(o.stall is None for o in outs):
            samples.append((sum(sizes), seconds))

    try:
        seqs.extend(core.add_sequence() for _ in range(max(1, sessions)))
        timed([1] * len(seqs))  # warm-up: first-call costs (allocation, kernel set-up) are not a step's
        samples.clear()
        for _ in range(repeats):
            timed([1])
            timed([1] * len(seqs))
            timed([chunk])
    finally:
        for sid in seqs:
            core.free_sequence(sid)
    return samples
