"""The tick loop, the metronome: pacing, gathering, dispatch.

Each tick gathers a chunk from every session with a frame waiting, within the tick's token
budget (``budget.plan_tick``, sized from the measured step cost, ``cost.StepCost``), runs
one batched step on the core thread (``step.py``; the event loop never blocks on torch),
classifies what the step did for each frame (``outcome.classify``), and applies it
(``delivery.Delivery``). Ticks come at most one per ``TimingConfig.period``, keeping the
metronome's phase. A step that runs past the watchdog's limit is judged slow (within its
tokens' measured cost: load is shed) or stuck (its frames are answered at once);
``max_failed_ticks`` failed ticks in a row shut the engine down. Context queued ahead of
frames (system prompts prefilled at open, ``TimingConfig.prompt_at_open``; turns given with
``Session.append``) shares the budget with frames (``delivery.apply_context_ahead``); while every session has
such context, no frame can be waiting on the beat, so those ticks are neither paced nor held to
the budget (``max_chunk_tokens`` still caps each chunk) and leave the metronome's phase alone:
the context goes in as soon as it can, and the frame that follows goes at once.

Why this module is past 400 lines: one tick's phases (gather, dispatch, the watchdog's
verdicts on that tick's step, apply) share its entries and the loop's pacing; each pure part
already lives in its own module (``budget``, ``outcome``, ``delivery``).
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable

import anyio
import anyio.abc

from .._config import ReliabilityConfig, TimingConfig
from .._exceptions import StallReason
from .._log import get_logger
from .._stats import TickReport
from .admission import Admitter
from .budget import Demand, plan_tick, tick_budget
from .channel import DecodeRounds
from .cost import StepCost
from .counters import Counters, Fault
from .delivery import Delivery, apply_context_ahead
from .outcome import FrameChunk, StepFailed, classify
from .signal import Signal
from .state import EngineState, SessionState
from .step import StepPart, StepResult, run_tick_step
from .watchdog import Verdict, judge, watch

__all__: list[str] = []  # internal: TickLoop


class TickLoop:
    def __init__(
        self,
        shared: EngineState,
        *,
        counters: Counters,
        delivery: Delivery,
        admitter: Admitter,
        timing: TimingConfig,
        reliability: ReliabilityConfig,
        clock: Callable[[], float],
        on_tick: Callable[[TickReport], None] | None,
        cost: StepCost,
        stop_ids: frozenset[int],
        room: Callable[[], None],
        free: Callable[[SessionState], Awaitable[None]],
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
        self.cost = cost  # step seconds vs tokens, measured: sizes the tick budget
        self._stop_ids = stop_ids
        self.budget_now: int | None = None  # the last tick's budget
        self._waiting: list[int] = []  # sessions that waited on the last tick's budget
        self._prefills: list[tuple[SessionState, int]] = []  # this tick's context appended ahead (a prompt, a turn)
        self._room = room
        self._free = free
        self._fail = fail
        self._log = get_logger()
        self._wake = Signal()
        self._idle = Signal()  # fired when the loop stops
        self.tick_finished = Signal()  # fired when the tick in flight has been delivered
        self.last_error: BaseException | None = None
        self.to_free: list[SessionState] = []  # sessions the engine ended in a tick: freed after it
        self._running = False
        self._next_tick = -math.inf
        self._asyncio_task: asyncio.Task[None] | None = None

    # starting and waking -------------------------------------------------------------------------

    def wake(self) -> None:
        self._wake.fire()

    @property
    def running(self) -> bool:
        return self._running

    @property
    def next_tick(self) -> float:
        """When (``anyio.current_time()``) the next tick may start: the metronome's phase (``-inf`` before any)."""
        return self._next_tick

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
        return any((s.channel.inputs or s.context_ahead) and not s.rewinding for s in self.shared.sessions.values())

    def _context_only(self) -> bool:
        """Every session has context to append before its frames (which wait on it): no beat to keep.
        Not after a failed tick, which is retried a period later as any other."""
        slots = self.shared.sessions.values()
        return bool(slots) and all(s.context_ahead for s in slots) and self.counters.failed_in_row == 0

    async def run(self) -> None:
        try:
            while not self.shared.closed:
                if not self._has_work():
                    if not self.shared.sessions:
                        break  # idle: the next session starts the loop again
                    await self._wake.wait()
                    continue
                delay = self._next_tick - anyio.current_time()
                if delay > 0 and not self._context_only():
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

    def gather(self, *, ahead: bool = False) -> list[FrameChunk]:
        """This tick's chunk of every session with input, within the tick's token budget."""
        heads: dict[int, tuple[SessionState, list[int]]] = {}
        prefills: dict[int, SessionState] = {}
        demands = []
        for slot in self.shared.sessions.values():
            channel = slot.channel
            if slot.rewinding:  # going back to its mark: its frames wait until the context is there
                continue
            if slot.context_ahead:  # its context (a prompt, a turn) goes in first: its frames wait until it has
                prefills[slot.session_id] = slot
                demands.append(Demand(slot.session_id, len(slot.context_ahead), 1, False, slot.waited))
                continue
            if not channel.inputs:
                continue
            head = slot.reply_head()
            if not head and not channel.inputs[0].tokens:
                pending = channel.inputs.popleft()
                channel.input_taken()
                why = (
                    "the session has appended nothing yet"
                    if slot.num_tokens == 0
                    else "its last output was withdrawn (a cancelled step() or interrupt()), so the model has "
                    "no token of its own to go on from"
                )
                self.delivery.push(slot, pending.index, ValueError(f"nothing to decode from: {why}; send input"))
                continue
            heads[slot.session_id] = (slot, head)
            need = len(head) + len(channel.inputs[0].tokens)
            talking = channel.counts.frames > 0
            demands.append(Demand(slot.session_id, need, slot.decode_tokens, talking, slot.waited))
        step_cost = self.cost.step_tokens() if self.cost.ready else 0
        self.budget_now = tick_budget(self.timing, self.cost)
        # ``ahead``: only context, no frame on the beat to keep within the deadline; max_chunk still caps it
        budget = None if ahead else self.budget_now
        plan = plan_tick(demands, budget=budget, max_chunk=self.timing.max_chunk_tokens, step_cost=step_cost)
        entries = []
        self._waiting = []
        self._prefills = []
        for sid, slot in prefills.items():
            if plan[sid].chunk == 0:
                slot.waited += 1
                continue
            slot.waited = 0
            self._prefills.append((slot, plan[sid].chunk))
        for sid, (slot, head) in heads.items():
            grant = plan[sid]
            if grant.chunk == 0:  # waits on the budget this tick: counted, and first in line soon
                slot.waited += 1
                self.counters.budget_wait()
                self._waiting.append(sid)
                continue
            slot.waited = 0
            pending = slot.channel.inputs[0]
            tokens = (head + pending.tokens)[: grant.chunk]
            if head:
                slot.reply_in_chunk()
            entries.append(
                FrameChunk(slot, pending, tokens, grant.chunk - len(head), grant.decode > 0, decode=grant.decode)
            )
        return entries

    # dispatch ------------------------------------------------------------------------------------

    async def tick(self) -> None:
        ahead = self._context_only()
        entries = self.gather(ahead=ahead)
        prefills = self._prefills
        if not entries and not prefills:
            return
        start, period = anyio.current_time(), self.timing.period
        if not ahead:  # context alone keeps no beat: the frame after it need not wait a period
            # keep the metronome's phase unless a whole period was lost (idle, or a slow step)
            base = self._next_tick if start - self._next_tick < period else start
            self._next_tick = base + period
        for e in entries:
            e.slot.in_tick = e.pending.in_tick = True
            # several tokens decoded in the tick: interrupt() stops the rounds and counts those begun
            e.pending.rounds = DecodeRounds() if e.finishes and e.decode > 1 else None
        for slot, _ in prefills:
            slot.in_tick = True
        try:
            work = [
                StepPart(
                    e.slot.seq_id, e.slot.sampling, e.tokens, e.finishes, e.decode, e.slot.pinned, e.pending.rounds
                )
                for e in entries
            ]
            work += [StepPart(s.seq_id, s.sampling, s.context_ahead[:n], False, 0, s.pinned) for s, n in prefills]
            job = self.shared.worker.submit(
                run_tick_step, self.shared.core, work, self.reliability.step_retries, self._stop_ids
            )
            limit = max(self.reliability.watchdog * self.timing.frame_deadline, self.reliability.watchdog_floor)
            expected = self._expected_seconds(entries, sum(n for _, n in prefills))
            stuck = 0
            worker = self.shared.worker
            cpu0 = last_cpu = worker.cpu_seconds()
            last_running = 0.0

            def on_long(times: int, running: float) -> bool:
                # slow or stuck: is the core thread still working (CPU time), within what its tokens take?
                nonlocal stuck, last_cpu, last_running
                cpu = worker.cpu_seconds()
                worked = None if cpu is None or cpu0 is None else cpu - cpu0
                recent = None if cpu is None or last_cpu is None else cpu - last_cpu
                window, last_cpu, last_running = running - last_running, cpu, running
                verdict = judge(
                    worked=worked, recent=recent, window=window, expected=expected, slack=self.reliability.watchdog
                )
                if not stuck and verdict is Verdict.SLOW:
                    self.on_slow(entries, times, running, expected)
                    return True
                stuck += 1
                return self.on_stuck(entries, stuck, running, limit)

            returned = await watch(
                job,
                clock=anyio.current_time,  # real time, as the metronome paces ticks: a stuck thread is wall-clock
                limit=limit,
                poll=min(period, limit / 4),
                on_stuck=on_long,
                give_up=lambda times: times > 0 and self.shared.closed,  # closing: never wait on a stuck step
            )
            if not returned:
                self.shared.worker.abandon()
                self._log.error("engine.core_abandoned", stuck_ticks=self.counters.failed_in_row)
                return
            result = job.outcome()
            self.shared.pool = result.pool
            self.counters.pool(result.pool)
            apply_context_ahead(prefills, result, len(entries), self.delivery)
            self._apply(entries, result, self._clock())
        finally:
            for e in entries:
                e.slot.in_tick = e.pending.in_tick = False
            for slot, _ in prefills:
                slot.in_tick = False
            self.tick_finished.fire()
        ended, self.to_free = self.to_free, []
        for slot in ended:
            await self._free(slot)

    def _apply(self, entries: list[FrameChunk], result: StepResult, done: float) -> None:
        for tokens, seconds in result.steps:  # the budget follows the machine
            self.admitter.observe_step(tokens, seconds)  # against the cost it was predicted by
            self.cost.observe(tokens, seconds)
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
            decoded = result.tokens[i] if failed is None else ()
            outcome = classify(e, failed or result.outputs[i], pool=pool, bounded=bounded, decoded=decoded)
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
        self.counters.tick(done, grown, len(self.shared.sessions))
        appended = sum(t for t, _ in result.steps)
        self._account(tick, done, entries, stalled, latencies, result.step_seconds, appended, grown)

    # the watchdog --------------------------------------------------------------------------------

    def _expected_seconds(self, entries: list[FrameChunk], prefill: int = 0) -> float | None:
        """What this tick's step should take at the slowest rate measured (``None``: nothing measured)."""
        cost = self.cost
        if not cost.ready:
            return None
        tokens = prefill + sum(len(e.tokens) + max(0, e.decode - 1) for e in entries)
        rounds = max((e.decode - 1 for e in entries), default=0)
        return (cost.seconds(tokens) + rounds * cost.fixed) * cost.slowest()

    def on_slow(self, entries: list[FrameChunk], times: int, running: float, expected: float | None) -> None:
        """A long step that is still within its tokens' cost: not stuck. Shed load so the next ticks fit.

        Each watchdog period it runs cuts the admission cap; from the second on, the session
        admitted last among the step's is shed with ``LoadShed`` (never the last one open).
        """
        if times == 1:
            self.counters.fault(Fault.STEP_SLOW)
        admitter = self.admitter
        before, limit = admitter.limit, admitter.cut()
        self.counters.limit(limit)
        self._log.warning("engine.step_slow", running=running, expected=expected, old_limit=before, limit=limit)
        order = {sid: i for i, sid in enumerate(self.shared.sessions)}
        live = [e.slot for e in entries if e.slot.session_id in order]
        if times < 2 or len(self.shared.sessions) < 2 or not live:
            return
        victim = max(live, key=lambda s: order[s.session_id])
        self.delivery.shed(
            victim,
            f"session {victim.session_id} was shed: a step ran {running:.2f} s, past the watchdog's limit, on a "
            "machine that cannot hold this load at the deadline; open a new session after retry_after",
        )

    def shed_newest(self, count: int, step_seconds: float) -> None:
        """The deadline is missed with admission stopped: the ``count`` newest sessions go with ``LoadShed``
        (never the last one open)."""
        newest = list(self.shared.sessions.values())[::-1][: min(count, len(self.shared.sessions) - 1)]
        self._log.warning("admission.shed", sessions=len(newest), in_flight=len(self.shared.sessions))
        for slot in newest:
            self.delivery.shed(
                slot,
                f"session {slot.session_id} was shed: frames miss the deadline with admission stopped (the last "
                f"step took {step_seconds:.3f} s); this machine cannot hold its sessions now; open a new session "
                "after retry_after",
            )

    def on_stuck(self, entries: list[FrameChunk], times: int, running: float, limit: float) -> bool:
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
        for slot in list(self.shared.sessions.values()):
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
        entries: list[FrameChunk],
        stalled: list[int],
        latencies: list[float],
        step_seconds: float,
        tokens: int,
        grown: int,
    ) -> None:
        admitter, n = self.admitter, len(self.shared.sessions)
        before = admitter.limit
        limit = admitter.update(n)
        if limit != before:
            self._log.info("admission.limit_changed", old=before, new=limit, in_flight=n, by=admitter.bound_by)
            if limit > before:
                self._room()
        shed = admitter.to_shed()
        if shed:
            self.shed_newest(shed, step_seconds)
            n = len(self.shared.sessions)
        pool = self.shared.pool
        self.counters.limit(limit)
        self.counters.pool(pool)
        t_sat = self.counters.t_sat(pool, n, bounded=self.shared.session_blocks is not None)
        self.counters.publish_t_sat(t_sat)
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
                tokens=tokens,
                waiting=tuple(self._waiting),
                tick_tokens=self.budget_now,
                grown_blocks=grown,
                growth_rate=self.counters.growth_rate(),
                t_sat=t_sat,
            )
            try:
                self._on_tick(report)
            except Exception:  # an observer must not stop the metronome
                self._log.exception("engine.on_tick_failed", tick=tick)
