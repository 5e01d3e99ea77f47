"""The watchdog: wait for a step, and speak up when it runs past its limit.

A step on the core thread cannot be interrupted, but the event loop need not wait on
it blindly: it waits in short slices and, each time the step has run another
``limit`` seconds (real time: a stuck thread is a wall-clock matter), calls
``on_stuck`` at once, while the step is still running. ``on_stuck`` says whether to
keep waiting or to give up on the step.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import anyio

from ._worker import Job

__all__: list[str] = []  # internal: watch


async def watch(
    job: Job[Any],
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
