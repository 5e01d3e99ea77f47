"""Experiments side by side: every run of a benchmark, a few engines at a time."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import TypeVar

import anyio

__all__ = ["run_concurrently"]

_Run = TypeVar("_Run")


def run_concurrently(
    runs: Sequence[Callable[[], Awaitable[_Run]]],
    *,
    concurrency: int,
    on_run: Callable[[_Run], None] | None = None,
) -> list[_Run]:
    """Every run, ``concurrency`` engines at a time, each handed to ``on_run`` as it ends (in that order)."""
    results: list[_Run] = []

    async def main() -> None:
        limiter = anyio.CapacityLimiter(concurrency)

        async def one(run: Callable[[], Awaitable[_Run]]) -> None:
            async with limiter:
                result = await run()
            results.append(result)
            if on_run is not None:
                on_run(result)

        async with anyio.create_task_group() as tg:
            for run in runs:
                tg.start_soon(one, run)

    anyio.run(main)
    return results
