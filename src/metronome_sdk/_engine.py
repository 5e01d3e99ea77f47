"""The async engine: its lifecycle, admission, and the sessions it serves.

``Engine`` owns an engine core, the core's thread and the tick loop. Its jobs live in their
own modules in ``_core/``: the tick loop's pacing, gathering and dispatch in ``tick.py``; what a
step did for a frame in ``outcome.py`` (pure) and its delivery in ``delivery.py``; admission in
``admission.py`` and ``door.py``; a session's queues in ``channel.py``; input encoding in
``encoding.py``; every count in ``counters.py``. All engine-core calls (loading, calibrating,
opening and freeing sequences, steps, pool stats) run on the core thread (``worker.py``), in
order, so they never race a step.

Why this module is past 400 lines: it is the public class, and what is left here is what only
the owner of every part can do: assemble them at start (after loading and calibrating), take a
session in and out of the admitted set, and close down in the two ways (by the application,
or after repeated faults), each of which touches every part.

Faults (docs/reliability.md): a step that raises is retried, then its frames fail with
``EngineStalled``; a watchdog answers the frames of a stuck step at once; a session
whose logits come out non-finite is dropped with ``SessionBroken``; a session that
leaves its outputs unread is shed with ``LoadShed`` (or loses its oldest outputs);
``max_failed_ticks`` failed ticks in a row shut the engine down.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from types import TracebackType
from typing import TypeVar

import anyio
import anyio.abc

from metronome_engine import EngineBackend, PoolStats, SamplingParams

from ._codec import FrameCodec, TextTokenizer
from ._config import AdmissionConfig, EngineConfig, ReliabilityConfig, TimingConfig
from ._core.admission import UNMEASURED_LIMIT, Admitter, AIMDAdmitter, MemoryGuard
from ._core.budget import measured_tokens, tick_budget
from ._core.channel import ChannelState, QueuedFrame, SessionChannel
from ._core.cost import StepCost, calibrate
from ._core.counters import Counters, Fault
from ._core.delivery import Delivery
from ._core.door import AdmissionDoor
from ._core.encoding import InputEncoder
from ._core.link import LinkServices, SessionHost, SessionLink, SessionRequest
from ._core.model_admission import ModelAdmitter
from ._core.state import EngineState, SessionState
from ._core.tick import TickLoop
from ._core.worker import CoreAbandoned, CoreThread
from ._exceptions import (
    EngineClosed,
    EngineStalled,
    MetronomeError,
    StallReason,
)
from ._loading import load_core, load_tokenizer
from ._log import get_logger
from ._metrics import EngineMetrics
from ._session import Session
from ._stats import EngineStats, TickReport

T = TypeVar("T")

__all__ = ["Engine"]


class Engine(SessionHost, embedded=True):
    """Serves sessions from one engine core on a metronome.

    Give ``config`` to build the embedded engine (the model loads on a worker thread
    when the engine starts), or ``core`` to serve an engine core you built (any
    ``EngineBackend``: an ``EngineCore``, a ``VLLMEngineCore``; tests, benchmarks), not
    both. ``clock`` measures per-frame latency, growth and admission
    decisions (inject one to control time in tests); ticks themselves are paced in real
    time, one every ``timing.period``. ``on_tick`` receives a ``TickReport`` after every tick.
    ``codec`` turns audio frames into tokens (a ``FrameCodec``); there is no default, so an
    audio frame sent to an engine without one is refused with a ``ValueError`` naming ``codec=``.
    ``reliability`` sets the slow-consumer policy, step retries, the watchdog and when
    repeated failures shut the engine down (``ReliabilityConfig``).
    """

    def __init__(
        self,
        config: EngineConfig | None = None,
        *,
        timing: TimingConfig | None = None,
        admission: AdmissionConfig | None = None,
        core: EngineBackend | None = None,
        tokenizer: TextTokenizer | None = None,
        codec: FrameCodec | None = None,
        clock: Callable[[], float] = time.monotonic,
        on_tick: Callable[[TickReport], None] | None = None,
        reliability: ReliabilityConfig | None = None,
    ) -> None:
        if config is not None and core is not None:
            raise ValueError("give config to build an engine or core to serve one you built, not both")
        if config is not None and not isinstance(config, EngineConfig):
            raise ValueError(f"config must be an EngineConfig, got {type(config).__name__}")
        if codec is not None and not isinstance(codec, FrameCodec):
            raise ValueError(f"codec must have encode(samples, sample_rate), got {codec!r}")
        if reliability is not None and not isinstance(reliability, ReliabilityConfig):
            raise ValueError(f"reliability must be a ReliabilityConfig, got {type(reliability).__name__}")
        self.config = config if core is None else None
        if self.config is None and core is None:
            self.config = EngineConfig()
        self.timing = timing or TimingConfig()
        self.admission_config = admission or AdmissionConfig()
        self.reliability = reliability or ReliabilityConfig()
        self.codec = codec  # none by default: audio frames need one named (codec=), text and tokens do not
        self.metrics = EngineMetrics()
        self._counters = Counters(self.metrics, growth_window=self.timing.growth_window)
        self._core: EngineBackend | None = core
        self._tokenizer = tokenizer
        self._clock = clock
        self._on_tick = on_tick
        self._log = get_logger()
        self._worker = CoreThread()
        self._closed = False
        self._failure: EngineStalled | None = None  # why the engine shut itself down
        self._tg: anyio.abc.TaskGroup | None = None
        self._start_lock: anyio.Lock | None = None
        # made when the engine starts (the core loaded)
        self._shared: EngineState | None = None
        self._admitter: Admitter | None = None
        self._encoder: InputEncoder | None = None
        self._door: AdmissionDoor | None = None
        self._loop: TickLoop | None = None
        self._services: LinkServices | None = None  # what every session's link reaches

    # lifecycle -----------------------------------------------------------------------------------

    async def __aenter__(self) -> Engine:
        await self.start()
        tg = anyio.create_task_group()
        await tg.__aenter__()
        self._tg = tg
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
        if self._tg is not None:
            # exit the task group here, in the task and scope that entered it (never in aclose()),
            # and without the body's exception, so that it propagates as itself, not in a group
            tg, self._tg = self._tg, None
            await tg.__aexit__(None, None, None)

    @property
    def _started(self) -> bool:
        return self._shared is not None

    async def start(self) -> None:
        """Load the model (off the event loop) and size admission. Idempotent."""
        if self._started:
            return
        if self._closed:
            raise EngineClosed("the engine is closed; make a new Engine")
        if self._start_lock is None:
            self._start_lock = anyio.Lock()
        async with self._start_lock:
            if self._started:
                return
            if self._needs_load():
                await self._worker.call(self._load)
            core = self._require_core()
            bound, pool = await self._worker.call(self._sizes, core, self.timing.max_chunk_tokens)
            samples = None
            if self.timing.tick_tokens == "auto" or self.admission_config.initial_limit is None:
                # a few timed steps before any session, on the core thread: they size the tick budget
                samples = await self._worker.call(
                    functools.partial(calibrate, core, chunk=self.timing.max_chunk_tokens)
                )
            self._start_now(core, bound, pool, samples)

    def _needs_load(self) -> bool:
        return self._core is None or (self._tokenizer is None and self.config is not None)

    def _load(self) -> None:
        cfg = self.config
        assert cfg is not None  # a core-less engine always has a config
        if self._core is None:
            self._core = load_core(cfg)
        if self._tokenizer is None:
            self._tokenizer = load_tokenizer(cfg.model)

    @staticmethod
    def _sizes(core: EngineBackend, chunk: int) -> tuple[int | None, PoolStats]:
        return core.session_bound_blocks(chunk=chunk), core.pool_stats()

    def _start_now(
        self, core: EngineBackend, bound: int | None, pool: PoolStats, samples: list[tuple[int, float]] | None = None
    ) -> None:
        chunk = self.timing.max_chunk_tokens
        if bound is not None and bound > pool.num_blocks:
            raise ValueError(
                f"max_chunk_tokens={chunk} widens a session's bound to {bound} blocks, more than the pool's "
                f"{pool.num_blocks}; lower TimingConfig.max_chunk_tokens or grow the pool"
            )
        guard = MemoryGuard(pool_blocks=pool.num_blocks, session_blocks=bound)
        cost = StepCost(samples or ())
        fits = measured_tokens(self.timing, cost)
        measured = None if fits is None else fits // self.admission_config.session_tokens
        admitter: Admitter
        if self.admission_config.policy == "model":
            timing = self.timing
            admitter = ModelAdmitter(
                self.admission_config,
                deadline=timing.frame_deadline,
                cost=cost,  # the tick loop's own, refitted from every step
                budget=lambda: tick_budget(timing, cost),
                guard=guard,
                clock=self._clock,
                measured=measured,
            )
        else:
            admitter = AIMDAdmitter(
                self.admission_config,
                deadline=self.timing.frame_deadline,
                guard=guard,
                clock=self._clock,
                measured=measured,
            )
        if samples:
            self._log.info(
                "engine.calibrated",
                fixed_ms=round(cost.fixed * 1e3, 3),
                per_token_ms=round(cost.per_token * 1e3, 4),
                tick_tokens=tick_budget(self.timing, cost),
                measured_limit=measured,
                limit=admitter.limit,
            )
        shared = EngineState(core=core, worker=self._worker, pool=pool, session_blocks=bound)
        encoder = InputEncoder(self._tokenizer, self.codec, core.config.vocab_size)
        door = AdmissionDoor(
            shared,
            admitter,
            self._counters,
            encoder,
            max_chunk=self.timing.max_chunk_tokens,
            prompt_at_open=self.timing.prompt_at_open,
        )
        delivery = Delivery(
            counters=self._counters,
            timing=self.timing,
            reliability=self.reliability,
            admitter=admitter,
            tokenizer=self._tokenizer,
            end_session=self._end_session,
            in_flight=lambda: len(shared.sessions),
        )
        self._loop = TickLoop(
            shared,
            counters=self._counters,
            delivery=delivery,
            admitter=admitter,
            timing=self.timing,
            reliability=self.reliability,
            clock=self._clock,
            on_tick=self._on_tick,
            cost=cost,
            stop_ids=self._tokenizer.stop_ids if self._tokenizer is not None else frozenset(),
            room=door.room,
            free=self._free,
            fail=self._fail,
        )
        self._encoder, self._door, self._admitter = encoder, door, admitter
        counters = self._counters
        self._services = LinkServices(
            encoder=encoder,
            tokenizer=self._tokenizer,
            clock=self._clock,
            retry_after=self.timing.period,
            wake=self._wake_loop,
            input_refused=lambda: counters.fault(Fault.INPUT_REFUSED),
            release=self._release,
            on_core=self._on_core,
            tick_finished=self._tick_finished,
        )
        self._shared = shared
        self._counters.limit(admitter.limit)
        self._log.info("engine.started", policy=repr(core.policy), pool_blocks=pool.num_blocks, session_blocks=bound)

    def _require_core(self) -> EngineBackend:
        if self._core is None:
            raise RuntimeError("the engine has not loaded its model yet; enter it first (async with engine)")
        return self._core

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def core(self) -> EngineBackend:
        """The engine core this engine serves (after start)."""
        return self._require_core()

    @property
    def tokenizer(self) -> TextTokenizer | None:
        return self._tokenizer

    @property
    def next_tick(self) -> float | None:
        """When the next tick may start, in ``anyio.current_time()``'s clock; ``None`` before the first tick.

        Ticks come at most one per period and keep their phase, so a frame sent just after a
        tick waits almost a period for the next one, and that wait counts in its latency. A
        client whose next frame is ready early (a reply's next decode frame) sends it just
        before this time, and its frame's latency is the step's, not the metronome's phase.
        A time in the past means the next tick starts as soon as a frame comes.
        """
        loop = self._loop
        return None if loop is None or not math.isfinite(loop.next_tick) else loop.next_tick

    @property
    def failure(self) -> EngineStalled | None:
        """Why the engine shut itself down (repeated step failures), or ``None``."""
        return self._failure

    async def aclose(self) -> None:
        """Close every session (later use raises ``EngineClosed``) and return all blocks.

        Waits for a step in flight, but not for a stuck one: once the watchdog has
        declared the step stuck, the engine abandons its core thread and returns.
        """
        if self._closed:
            return
        await self._shut_down(None)

    async def _shut_down(self, failure: EngineStalled | None) -> None:
        """Close the engine: by the application (``failure`` None) or by the tick loop after repeated faults."""
        self._closed = True
        with anyio.CancelScope(shield=True):
            shared, loop = self._shared, self._loop
            slots = list(shared.sessions.values()) if shared is not None else []
            if shared is not None and loop is not None:
                shared.closed = True
                shared.sessions.clear()
                for slot in slots:
                    slot.ended = True
                    if failure is None:
                        slot.channel.close(ChannelState.ENGINE_CLOSED)
                loop.wake()
                assert self._door is not None
                self._door.room()
                if failure is None:
                    await loop.stopped()  # the tick in flight finishes (or is abandoned)
                ended, loop.to_free = loop.to_free, []
                for slot in [*slots, *ended]:
                    await self._free(slot)
                self._counters.sessions_open(0)
                self._counters.pool(shared.pool)
            await self._worker.aclose()
            if failure is not None:
                # told last, so that a session that hears of the failure finds the engine shut down
                for slot in slots:
                    for p in slot.channel.inputs:  # every frame sent gets its answer
                        slot.channel.put(p.index, self._engine_failed(slot.session_id, failure, p))
                    slot.channel.end(self._engine_failed(slot.session_id, failure, None))
            self.metrics.close()
            self._log.info("engine.closed", sessions=len(slots), failed=failure is not None)

    @staticmethod
    def _engine_failed(session_id: int, failure: EngineStalled, pending: QueuedFrame | None) -> EngineStalled:
        err = EngineStalled(
            str(failure),
            session_id=session_id,
            reason=StallReason.ENGINE_FAILED,
            frame=pending.frame if pending is not None else None,
        )
        err.__cause__ = failure.__cause__
        return err

    async def _fail(self) -> None:
        """Too many failed ticks in a row: shut the engine down, loudly, for every session."""
        assert self._loop is not None
        n = self._counters.failed_in_row
        last = self._loop.last_error
        what = f"the last step raised {last!r}" if last is not None else "the last step is stuck"
        failure = EngineStalled(
            f"the engine shut down after {n} failed ticks in a row ({what}); make a new Engine",
            reason=StallReason.ENGINE_FAILED,
        )
        failure.__cause__ = last
        self._failure = failure
        self._counters.fault(Fault.ENGINE_FAILED)
        self._log.error("engine.failed", failed_ticks=n, error=repr(last))
        await self._shut_down(failure)

    # sessions ------------------------------------------------------------------------------------

    def session(
        self,
        system_prompt: str | None = None,
        *,
        sampling: SamplingParams | None = None,
        timeout: float | None = None,
        decode_tokens: int = 1,
        pin_system_prompt: bool = True,
        rewind_tokens: int = 0,
    ) -> Session:
        """A session on this engine, opened by ``async with`` (waits up to ``timeout`` for room)."""
        return Session(
            system_prompt,
            engine=self,
            sampling=sampling,
            timeout=timeout,
            decode_tokens=decode_tokens,
            pin_system_prompt=pin_system_prompt,
            rewind_tokens=rewind_tokens,
        )

    def try_session(
        self,
        system_prompt: str | None = None,
        *,
        sampling: SamplingParams | None = None,
        decode_tokens: int = 1,
        pin_system_prompt: bool = True,
        rewind_tokens: int = 0,
    ) -> Session:
        """Open a session now or raise ``AdmissionRejected`` at once: the nowait twin of ``session()``."""
        return self.session(
            system_prompt,
            sampling=sampling,
            decode_tokens=decode_tokens,
            pin_system_prompt=pin_system_prompt,
            rewind_tokens=rewind_tokens,
        ).open_nowait()

    async def open_link(self, request: SessionRequest, *, timeout: float | None = None) -> SessionLink:
        """Admit a session, waiting up to ``timeout`` for room: its link, or ``AdmissionRejected``.

        What ``Session.open()`` calls; applications open sessions with ``session()``.
        """
        await self.start()
        self._check_serving(request.session_id)
        assert self._door is not None
        wait = self.admission_config.queue_timeout if timeout is None else timeout
        state = await self._door.wait(self._channel(request), request, wait)
        self._check_serving(request.session_id)  # the engine may have closed while the session waited
        return self._link(state)

    def open_link_nowait(self, request: SessionRequest) -> SessionLink:
        """Admit a session now or raise ``AdmissionRejected`` at once (``Session.open_nowait()``)."""
        if not self._started:
            if self._needs_load():
                raise RuntimeError("the engine has not loaded its model yet; enter it first (async with engine)")
            # no tick has run, so no step can race these two core calls on the event loop
            core = self._require_core()
            self._start_now(core, *self._sizes(core, self.timing.max_chunk_tokens))
        self._check_serving(request.session_id)
        assert self._door is not None
        return self._link(self._door.admit_nowait(self._channel(request), request))

    def _channel(self, request: SessionRequest) -> SessionChannel:
        rel = self.reliability
        return SessionChannel(
            request.session_id,
            input_queue=rel.input_queue,
            output_queue=rel.output_queue,
            drop_oldest=rel.slow_consumer == "drop_oldest",
        )

    def _link(self, state: SessionState) -> SessionLink:
        assert self._services is not None
        if state.context_ahead:  # TimingConfig.prompt_at_open: the tick loop prefills the prompt now, not with a frame
            self._wake_loop()
        return SessionLink(state, self._services)

    def _wake_loop(self) -> None:
        assert self._loop is not None
        self._loop.wake()
        self._loop.ensure_running(self._tg)

    def _check_serving(self, session_id: int) -> None:
        if self._failure is not None:
            raise self._engine_failed(session_id, self._failure, None)
        if self._closed:
            raise EngineClosed("the engine is closed; no session can open on it", session_id=session_id)

    async def _release(self, slot: SessionState) -> None:
        """The application closed the session: forget it, return its blocks before returning."""
        shared = self._shared
        if shared is None or slot.ended:
            return  # the engine ended it and freed (or frees) its blocks
        slot.ended = True
        shared.sessions.pop(slot.session_id, None)
        self._counters.sessions_open(len(shared.sessions))
        assert self._loop is not None and self._door is not None
        self._door.room()
        self._loop.wake()  # the tick loop rests when the last session has gone
        await self._free(slot)

    def _end_session(self, slot: SessionState, error: MetronomeError, fault: Fault) -> bool:
        """The engine ends ``slot``'s session: out of the admitted set now, its blocks freed after the tick."""
        shared, loop = self._shared, self._loop
        assert shared is not None and loop is not None
        if slot.ended:
            return False
        slot.ended = True
        shared.sessions.pop(slot.session_id, None)
        self._counters.fault(fault)
        self._counters.sessions_open(len(shared.sessions))
        slot.channel.end(error)
        slot.log.warning("session.closed", by="engine", error=type(error).__name__, frames=slot.channel.counts.frames)
        loop.to_free.append(slot)
        assert self._door is not None
        self._door.room()
        return True

    async def _tick_finished(self) -> None:
        """Return when the tick in flight (or the next one) has been delivered or abandoned."""
        loop = self._loop
        assert loop is not None
        await loop.tick_finished.wait()

    async def _out_of_tick(self, slot: SessionState) -> None:
        """Return once no tick in flight holds the session (it finished, or was abandoned)."""
        while slot.in_tick:
            await self._tick_finished()

    async def _on_core(self, slot: SessionState, fn: Callable[[EngineBackend], T]) -> T:
        """``fn(core)`` on the core thread, once no tick in flight holds the session (a hold, a rewind)."""
        shared = self._shared
        assert shared is not None
        await self._out_of_tick(slot)
        return await self._worker.call(fn, shared.core)

    async def _free(self, slot: SessionState) -> None:
        shared = self._shared
        assert shared is not None
        # a tick in flight may be opening this session's sequence: let it finish (or be abandoned) first
        await self._out_of_tick(slot)
        seq_id, slot.seq_id = slot.seq_id, None
        if seq_id is None:
            return
        try:
            # on the core thread, queued behind any step: never while one runs
            shared.pool = await self._worker.call(self._free_sequence, shared.core, seq_id)
        except CoreAbandoned:
            return  # the core went with its stuck thread; its blocks go with it
        self._counters.pool(shared.pool)

    @staticmethod
    def _free_sequence(core: EngineBackend, seq_id: int) -> PoolStats:
        core.free_sequence(seq_id)
        return core.pool_stats()

    # observability -------------------------------------------------------------------------------

    def stats(self) -> EngineStats:
        loop = self._loop
        return self._counters.snapshot(
            self._shared,
            self._admitter,
            deadline=self.timing.frame_deadline,
            initial_limit=self.admission_config.initial_limit or UNMEASURED_LIMIT,
            failed=self._failure is not None,
            tick_tokens=tick_budget(self.timing, loop.cost) if loop is not None else None,
        )

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("started" if self._started else "new")
        policy = repr(self._core.policy) if self._core is not None else repr(self.config)
        sessions = len(self._shared.sessions) if self._shared is not None else 0
        return f"Engine({policy}, sessions={sessions}, {state})"
