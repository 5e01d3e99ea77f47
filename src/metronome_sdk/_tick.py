"""The tick loop, the metronome: pacing, gathering, dispatch.

Each tick gathers one chunk from every session with a frame waiting, runs one batched step
on the core thread (the event loop never blocks on torch), classifies what the step did for
each frame (``_outcome.classify``), and applies it (``_delivery.Delivery``). Ticks come at
most one per ``TimingConfig.period``, keeping the metronome's phase. A step that raises is
retried at once; a step that runs past the watchdog's limit has its frames answered at once
(``on_stuck``); ``max_failed_ticks`` failed ticks in a row shut the engine down.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

import anyio
import anyio.abc

from metronome_engine import PoolStats, SamplingParams, StepOutput, StepRequest

from ._admission import AIMDAdmitter
from ._config import ReliabilityConfig, TimingConfig
from ._counters import Counters, Fault
from ._delivery import Delivery
from ._exceptions import StallReason
from ._log import get_logger
from ._outcome import Entry, StepFailed, classify
from ._signal import Signal
from ._state import Shared, Slot
from ._stats import TickReport
from ._watchdog import watch

__all__: list[str] = []  # internal: TickLoop


@dataclass(slots=True)
class _WorkResult:
    seq_ids: list[int]
    outputs: list[StepOutput]
    pool: PoolStats
    step_seconds: float
    error: BaseException | None
    failures: int  # attempts that raised (retried ones included)
    raised: BaseException | None  # the last exception a try raised, even if a retry then succeeded


class TickLoop:
    def __init__(
        self,
        shared: Shared,
        *,
        counters: Counters,
        delivery: Delivery,
        admitter: AIMDAdmitter,
        timing: TimingConfig,
        reliability: ReliabilityConfig,
        clock: Callable[[], float],
        on_tick: Callable[[TickReport], None] | None,
        room: Callable[[], None],
        free: Callable[[Slot], Awaitable[None]],
        fail: Callable[[], Awaitable[None]],
    ) -> None:
        self.shared = shared
        self.counters = counters
        self.delivery = delivery
        self.admitter = admitter
        self.timing = timing
        self.reliability = reliability
        self._clock = clock
        self._on_tick = on_tick
        self._room = room
        self._free = free
        self._fail = fail
        self._log = get_logger()
        self._wake = Signal()
        self._idle = Signal()  # fired when the loop stops
        self.tick_finished = Signal()  # fired when the tick in flight has been delivered
        self.last_error: BaseException | None = None
        self.to_free: list[Slot] = []  # sessions the engine ended in a tick: freed after it
        self._running = False
        self._next_tick = -math.inf
        self._asyncio_task: asyncio.Task[None] | None = None

    # starting and waking -------------------------------------------------------------------------

    def wake(self) -> None:
        self._wake.fire()

    @property
    def running(self) -> bool:
        return self._running

    async def stopped(self) -> None:
        """Wait until the loop has stopped (the tick in flight finished, or was abandoned)."""
        while self._running:
            await self._idle.wait()

    def ensure_running(self, tg: anyio.abc.TaskGroup | None) -> None:
        """Start the loop if it is not running: it runs while there is work or sessions."""
        if self._running or self.shared.closed:
            return
        self._running = True
        if tg is not None:
            tg.start_soon(self.run)
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._running = False
            raise RuntimeError("an engine not entered with `async with` runs only under asyncio") from None
        self._asyncio_task = loop.create_task(self.run())

    def _has_work(self) -> bool:
        return any(s.channel.inputs for s in self.shared.slots.values())

    async def run(self) -> None:
        try:
            while not self.shared.closed:
                if not self._has_work():
                    if not self.shared.slots:
                        break  # idle: the next session starts the loop again
                    await self._wake.wait()
                    continue
                delay = self._next_tick - anyio.current_time()
                if delay > 0:
                    await anyio.sleep(delay)  # the metronome: at most one tick per period
                    continue
                with anyio.CancelScope(shield=True):
                    await self.tick()
                    if self.counters.failed_in_row >= self.reliability.max_failed_ticks and not self.shared.closed:
                        await self._fail()
        finally:
            self._running = False
            self._asyncio_task = None
            self._idle.fire()

    # gathering -----------------------------------------------------------------------------------

    def gather(self) -> list[Entry]:
        budget = self.timing.max_chunk_tokens
        entries = []
        for slot in self.shared.slots.values():
            channel = slot.channel
            if not channel.inputs:
                continue
            pending = channel.inputs[0]
            head = [slot.feedback[0]] if slot.feedback is not None else []
            take = pending.tokens[: budget - len(head)]
            tokens = head + take
            if not tokens:
                channel.inputs.popleft()
                channel.input_taken()
                why = (
                    "the session has appended nothing yet"
                    if slot.num_tokens == 0
                    else "its last output was withdrawn (a cancelled step() or interrupt()), so the model has "
                    "no token of its own to go on from"
                )
                self.delivery.push(slot, pending.index, ValueError(f"nothing to decode from: {why}; send input"))
                continue
            if slot.feedback is not None:
                channel.feedback_appended(slot.feedback[1])
            entries.append(Entry(slot, pending, tokens, len(take), finishes=len(take) == len(pending.tokens)))
        return entries

    # dispatch ------------------------------------------------------------------------------------

    def _work(self, entries: list[tuple[int | None, SamplingParams | None, list[int], bool]]) -> _WorkResult:
        """On the core thread: open the sequences of new sessions, run one batched step.

        A step that raises has changed nothing (the core rolls back), so it is retried at
        once, ``step_retries`` times: a transient fault costs one step's time, not a frame.
        """
        core = self.shared.core
        seq_ids = [sid if sid is not None else core.add_sequence(sampling=sampling) for sid, sampling, _, _ in entries]
        requests = [
            StepRequest(sid, toks, sample=finish) for sid, (_, _, toks, finish) in zip(seq_ids, entries, strict=True)
        ]
        t0 = time.perf_counter()
        outputs: list[StepOutput] = []
        error: BaseException | None = None
        raised: BaseException | None = None
        failures = 0
        for _ in range(self.reliability.step_retries + 1):
            try:
                outputs, error = core.step(requests), None
                break
            except Exception as exc:  # every session of the tick hears of it if no retry succeeds
                failures += 1
                error = raised = exc
        return _WorkResult(seq_ids, outputs, core.pool_stats(), time.perf_counter() - t0, error, failures, raised)

    async def tick(self) -> None:
        entries = self.gather()
        if not entries:
            return
        start, period = anyio.current_time(), self.timing.period
        # keep the metronome's phase unless a whole period was lost (idle, or a slow step)
        base = self._next_tick if start - self._next_tick < period else start
        self._next_tick = base + period
        for e in entries:
            e.slot.in_tick = e.pending.in_tick = True
        try:
            work = [(e.slot.seq_id, e.slot.sampling, e.tokens, e.finishes) for e in entries]
            job = self.shared.worker.submit(self._work, work)
            limit = max(self.reliability.watchdog * self.timing.frame_deadline, self.reliability.watchdog_floor)
            returned = await watch(
                job,
                clock=anyio.current_time,  # real time, as the metronome paces ticks: a stuck thread is wall-clock
                limit=limit,
                poll=min(period, limit / 4),
                on_stuck=lambda times, running: self.on_stuck(entries, times, running, limit),
                give_up=lambda times: times > 0 and self.shared.closed,  # closing: never wait on a stuck step
            )
            if not returned:
                self.shared.worker.abandon()
                self._log.error("engine.core_abandoned", stuck_ticks=self.counters.failed_in_row)
                return
            result = job.outcome()
            self.shared.pool = result.pool
            self.counters.pool(result.pool)
            self._apply(entries, result, self._clock())
        finally:
            for e in entries:
                e.slot.in_tick = e.pending.in_tick = False
            self.tick_finished.fire()
        ended, self.to_free = self.to_free, []
        for slot in ended:
            await self._free(slot)

    def _apply(self, entries: list[Entry], result: _WorkResult, done: float) -> None:
        if result.failures:
            self.counters.fault(Fault.STEP_FAILED, result.failures)
            self._log.error(
                "engine.step_failed", tries=result.failures, error=repr(result.raised), recovered=result.error is None
            )
        if result.error is not None:
            self.last_error = result.error
            self.counters.tick_failed()
        else:
            self.counters.tick_succeeded()
        pool, bounded = result.pool, self.shared.session_blocks is not None
        tick = self.counters.ticks
        latencies: list[float] = []
        stalled: list[int] = []
        grown = 0
        for i, e in enumerate(entries):
            e.slot.seq_id = result.seq_ids[i]
            failed = StepFailed(result.error, result.failures) if result.error is not None else None
            outcome = classify(e, failed or result.outputs[i], pool=pool, bounded=bounded)
            applied = self.delivery.apply(
                e,
                outcome,
                tick=tick,
                done=done,
                used_blocks=pool.used_blocks,
                pool_blocks=pool.num_blocks,
                cause=result.error,
                tries=result.failures,
            )
            grown += applied.grown
            if applied.stalled:
                stalled.append(e.slot.session_id)
            if applied.latency is not None:
                latencies.append(applied.latency)
        self.counters.tick(done, grown, len(self.shared.slots))
        self._account(tick, done, entries, stalled, latencies, result.step_seconds)

    # the watchdog --------------------------------------------------------------------------------

    def on_stuck(self, entries: list[Entry], times: int, running: float, limit: float) -> bool:
        """The watchdog: the step has run ``times * limit`` seconds. Answer what waits on it; keep waiting?"""
        if times == 1:
            self.counters.fault(Fault.STEP_STUCK)
            self.last_error = None
        self.counters.tick_failed()
        self._log.error("engine.step_stuck", running=running, limit=limit, failed_in_row=self.counters.failed_in_row)
        for e in entries:
            channel = e.slot.channel
            if e.answered or not channel.open or not channel.inputs or channel.inputs[0] is not e.pending:
                continue
            e.answered = True
            channel.inputs.popleft()
            channel.input_taken()
            why = f"its step has run {running:.2f} s, past the watchdog's {limit:.2f} s"
            self.delivery.stalled(e.slot, e.pending, StallReason.STEP_STUCK, why)
        # frames queued behind the stuck step get their answer too: no step will serve them soon
        in_tick = {id(e.pending) for e in entries}
        for slot in list(self.shared.slots.values()):
            inputs = slot.channel.inputs
            while inputs and id(inputs[0]) not in in_tick:
                p = inputs.popleft()
                slot.channel.input_taken()
                self.delivery.stalled(
                    slot, p, StallReason.STEP_STUCK, f"the engine's step has been stuck for {running:.2f} s"
                )
        return self.counters.failed_in_row < self.reliability.max_failed_ticks

    # after the tick ------------------------------------------------------------------------------

    def _account(
        self,
        tick: int,
        done: float,
        entries: list[Entry],
        stalled: list[int],
        latencies: list[float],
        step_seconds: float,
    ) -> None:
        admitter, n = self.admitter, len(self.shared.slots)
        before = admitter.limit
        limit = admitter.update(n)
        if limit != before:
            self._log.info("admission.limit_changed", old=before, new=limit, in_flight=n)
            if limit > before:
                self._room()
        pool = self.shared.pool
        self.counters.limit(limit)
        self.counters.pool(pool)
        self.counters.publish_t_sat(self.counters.t_sat(pool, n, bounded=self.shared.session_blocks is not None))
        if self._on_tick is not None:
            report = TickReport(
                tick=tick,
                time=done,
                sessions=n,
                served=len(entries) - len(stalled),
                stalled=tuple(stalled),
                latencies=tuple(latencies),
                step_seconds=step_seconds,
                used_blocks=pool.used_blocks,
                pool_blocks=pool.num_blocks,
            )
            try:
                self._on_tick(report)
            except Exception:  # an observer must not stop the metronome
                self._log.exception("engine.on_tick_failed", tick=tick)
