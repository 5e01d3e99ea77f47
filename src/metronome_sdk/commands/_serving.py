"""Serving until Ctrl-C: what ``metronome demo`` and ``metronome serve`` share."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Iterator
from typing import Protocol

__all__ = ["serve_until", "stop_on_signals"]

_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class _Server(Protocol):
    @property
    def url(self) -> str: ...

    async def start(self) -> None: ...

    async def aclose(self) -> None: ...


@contextlib.contextmanager
def stop_on_signals() -> Iterator[asyncio.Event]:
    """An event that SIGINT and SIGTERM set. Taken before the model loads, so a Ctrl-C during
    the load stops the command once it is up instead of killing it half-started."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in _SIGNALS:
        loop.add_signal_handler(sig, stop.set)
    try:
        yield stop
    finally:
        for sig in _SIGNALS:
            loop.remove_signal_handler(sig)


async def serve_until(stop: asyncio.Event, server: _Server, where: str, ready: str) -> None:
    """Start ``server`` (a port it cannot take is a ``ValueError`` naming ``where``), print
    ``ready`` (``{url}`` is the server's), and serve until ``stop`` is set; then close it."""
    try:
        await server.start()
    except OSError as exc:
        raise ValueError(f"cannot listen on {where}: {exc.strerror or exc}") from exc
    try:
        print(ready.format(url=server.url), flush=True)
        await stop.wait()
    finally:
        await server.aclose()
