"""The engine core's own thread: every core call runs there, one at a time, in order.

Why not ``anyio.to_thread``: a step that hangs must be abandonable without letting
another call into the core (which is not thread-safe) and without keeping the process
from exiting. One daemon thread per engine gives both: later calls queue behind a stuck
step instead of racing it, and an engine that gives up on the thread can return at once.
Python cannot kill a thread; an abandoned one finishes its step (or never does) alone.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import queue
import threading
import time
from collections.abc import Callable
from typing import Any, Generic, TypeVar

import anyio
import anyio.from_thread
import anyio.lowlevel

__all__: list[str] = []  # internal: CoreThread, CoreCall, CoreAbandoned

T = TypeVar("T")
_names = itertools.count(1)


class CoreAbandoned(RuntimeError):
    """The engine gave up on its core thread (a stuck step); no more calls run there."""


class CoreCall(Generic[T]):
    """One call on the core thread. ``done`` fires (in the event loop) when it has returned or raised."""

    __slots__ = ("_notify", "args", "done", "error", "fn", "result", "returned")

    def __init__(
        self, fn: Callable[..., T], args: tuple[Any, ...], notify: Callable[[Callable[[], None]], None]
    ) -> None:
        self.fn = fn
        self.args = args
        self.done = anyio.Event()
        self.returned = False  # set on the core thread, read in the loop once done fired
        self.result: T | None = None
        self.error: BaseException | None = None
        self._notify = notify

    def outcome(self) -> T:
        if self.error is not None:
            raise self.error
        if not self.returned:
            raise CoreAbandoned("the engine abandoned its core thread before this call ran")
        return self.result  # type: ignore[return-value]

    def _run(self) -> None:
        try:
            self.result = self.fn(*self.args)
            self.returned = True
        except BaseException as exc:  # handed to the awaiting task, which decides
            self.error = exc
        self._finish()

    def _finish(self) -> None:
        with contextlib.suppress(RuntimeError):  # the event loop is gone: nobody is waiting
            self._notify(self.done.set)


def _notifier() -> Callable[[Callable[[], None]], None]:
    """A thread-safe, non-blocking way back into the running event loop."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        token = anyio.lowlevel.current_token()
        return lambda fn: anyio.from_thread.run_sync(fn, token=token)

    def notify(fn: Callable[[], None]) -> None:
        loop.call_soon_threadsafe(fn)

    return notify


class CoreThread:
    """A daemon thread that runs submitted calls in order; started on first use."""

    def __init__(self, name: str = "metronome-engine") -> None:
        self.name = f"{name}-{next(_names)}"
        self._jobs: queue.SimpleQueue[CoreCall[Any] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._abandoned = False
        self._lock = threading.Lock()
        self._pending: set[CoreCall[Any]] = set()

    @property
    def thread(self) -> threading.Thread | None:
        return self._thread

    def cpu_seconds(self) -> float | None:
        """CPU seconds the thread has run (``None`` where the platform cannot tell).

        The watchdog's sign of progress: a working step's thread accrues CPU time, a
        blocked or hung one does not, however long either has run.
        """
        thread = self._thread
        if thread is None or thread.ident is None or not hasattr(time, "pthread_getcpuclockid"):
            return None
        try:
            return time.clock_gettime(time.pthread_getcpuclockid(thread.ident))
        except OSError:  # the thread has exited
            return None

    def submit(self, fn: Callable[..., T], *args: Any) -> CoreCall[T]:
        """Queue ``fn(*args)``; await ``job.done``, then ``job.outcome()``. Call from the event loop."""
        job: CoreCall[T] = CoreCall(fn, args, _notifier())
        if self._abandoned:
            job.done.set()  # outcome() raises CoreAbandoned
            return job
        with self._lock:
            self._pending.add(job)
            if self._thread is None:
                self._thread = threading.Thread(target=self._serve, name=self.name, daemon=True)
                self._thread.start()
        self._jobs.put(job)
        return job

    async def call(self, fn: Callable[..., T], *args: Any) -> T:
        job = self.submit(fn, *args)
        await job.done.wait()
        return job.outcome()

    def _serve(self) -> None:
        while True:
            job = self._jobs.get()
            if job is None:
                return
            if not self._abandoned:
                job._run()
            else:
                job._finish()
            with self._lock:
                self._pending.discard(job)

    def abandon(self) -> None:
        """Give up on the thread: queued and later calls fail with ``CoreAbandoned`` at once.

        The call running now (a stuck step) is left to return on its own, or never.
        """
        if self._abandoned:
            return
        self._abandoned = True
        with self._lock:
            waiting = list(self._pending)
        for job in waiting:
            job.done.set()
        self._jobs.put(None)  # the thread exits if the stuck call ever returns

    async def aclose(self) -> None:
        """Run what is queued, then stop the thread and join it (no-op once abandoned)."""
        if self._abandoned:
            return
        thread = self._thread
        if thread is None:
            return
        await self.call(lambda: None)  # everything queued before has run
        self._jobs.put(None)
        with self._lock:
            self._thread = None
        # the thread has nothing left but to return: this join is immediate
        thread.join(timeout=1.0)
