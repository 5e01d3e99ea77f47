"""The watchdog: wait for a step, and speak up when it runs past its limit.

A step on the core thread cannot be interrupted, but the event loop need not wait on
it blindly: it waits in short slices and, each time the step has run another
``limit`` seconds (real time: a stuck thread is a wall-clock matter), calls
``on_stuck`` at once, while the step is still running. ``on_stuck`` says whether to
keep waiting or to give up on the step. ``judge`` tells a slow step (one whose tokens
take that long on this machine, by the measured cost model) from a stuck one.
"""

from __future__ import annotations

import enum
from collections.abc import Callable
from typing import Any

import anyio

from .worker import CoreCall

__all__: list[str] = []  # internal: watch, Verdict, judge


class Verdict(enum.Enum):
    """What a step that has run past the watchdog's limit is."""

    SLOW = "slow"  # within what its tokens take on this machine: late, still progressing; shed load
    STUCK = "stuck"  # far past that: answer its frames now


_WORKING = 0.01  # of the last period: a thread that got less CPU than this is blocked, not working


def judge(
    *, worked: float | None, recent: float | None, window: float, expected: float | None, slack: float
) -> Verdict:
    """Slow or stuck, for a step that has run past the watchdog's limit.

    Progress is the core thread's CPU time: ``worked`` seconds since the step began,
    ``recent`` over the last ``window`` seconds (``None``: the platform cannot tell).
    ``expected`` is what the step's tokens take by the measured cost model, at the slowest
    rate measured (``None``: nothing measured). The step is slow, not stuck, while it is
    working (it got CPU in the last period) and has not worked ``slack`` times what its
    tokens take: a long step on a CPU shared with other work advances, a hung one does not.
    With nothing to judge by, the limit alone decides: stuck.
    """
    if worked is None or recent is None or expected is None:
        return Verdict.STUCK
    if recent < _WORKING * window:
        return Verdict.STUCK  # blocked: waiting on something that does not come
    if worked >= slack * expected:
        return Verdict.STUCK  # working far longer than its tokens take here: spinning
    return Verdict.SLOW


async def watch(
    job: CoreCall[Any],
    *,
    clock: Callable[[], float],
    limit: float,
    poll: float,
    on_stuck: Callable[[int, float], bool],
    give_up: Callable[[int], bool] = lambda fired: False,
) -> bool:
    """Wait for ``job``; ``True`` once it is done, ``False`` if the wait was given up.

    ``on_stuck(times, seconds)`` is called when the step has run ``times * limit``
    seconds (``times`` = 1, 2, ...); it returns ``True`` to keep waiting.
    ``give_up(times)`` is asked after every slice (the engine is closing, say).
    """
    started = clock()
    fired = 0
    while not job.done.is_set():
        with anyio.move_on_after(poll):
            await job.done.wait()
        if job.done.is_set():
            break
        running = clock() - started
        if running >= limit * (fired + 1):
            fired += 1
            if not on_stuck(fired, running):
                return False
        if give_up(fired):
            return False
    return True
