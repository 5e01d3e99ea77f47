"""A short calibration at engine start: a few real steps, timed, through the backend's interface.

Runs on the engine's core thread before any session opens. It opens a few throwaway
sequences, times decode steps at batch 1 and at batch ``sessions`` and a prefill chunk
of ``chunk`` tokens, and frees them: about eight steps, a second on a small CPU. Any
``EngineBackend`` works; a backend whose pool cannot hold the sequences gives fewer
points (a stalled step is skipped, never counted).
"""

from __future__ import annotations

import time
from collections.abc import Callable

from metronome_engine import EngineBackend, StepRequest

__all__: list[str] = []  # internal: calibrate


def calibrate(
    core: EngineBackend,
    *,
    chunk: int,
    sessions: int = 8,
    repeats: int = 2,
    clock: Callable[[], float] = time.perf_counter,
) -> list[tuple[int, float]]:
    """``(tokens, seconds)`` of each timed step; the first step (warm-up) is not among them."""
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
