"""The async engine: the tick loop (the metronome) over an ``EngineCore`` on a worker thread.

Each tick gathers one frame (or one chunk of a long frame) from every session with
pending input, runs one batched step on the engine's core thread (the event loop never
blocks on torch), and delivers the outputs. All engine-core calls (loading, opening and
freeing sequences, steps) run on that one thread, in order, so they never race a step.

Faults (docs/reliability.md): a step that raises is retried, then its frames fail with
``EngineStalled``; a watchdog answers the frames of a stuck step at once; a session
whose logits come out non-finite is dropped with ``SessionBroken``; a session that
leaves its outputs unread is shed with ``LoadShed`` (or loses its oldest outputs);
``max_failed_ticks`` failed ticks in a row shut the engine down.
"""

from __future__ import annotations

import asyncio
import functools
import math
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal

import anyio

from metronome_engine import EngineBackend, EngineCore, PoolStats, SamplingParams, Stall, StepOutput, StepRequest

from ._admission import UNMEASURED_LIMIT, AIMDAdmitter, MemoryGuard, percentile
from ._budget import Demand, plan_tick
from ._calibrate import calibrate
from ._codec import FixedRateCodec, FrameCodec, TextTokenizer, chat_turn
from ._config import AdmissionConfig, EngineConfig, ReliabilityConfig, TimingConfig
from ._cost import StepCost
from ._exceptions import (
    AdmissionRejected,
    CacheExhausted,
    DeadlineMissed,
    EngineStalled,
    LoadShed,
    MetronomeError,
    Overloaded,
    SessionBroken,
    SessionClosed,
)
from ._frames import InputFrame, OutputFrame
from ._log import get_logger
from ._memory import ConversationMemory
from ._metrics import EngineMetrics
from ._stats import EngineStats, TickReport
from ._watchdog import Verdict, judge, watch
from ._worker import CoreAbandoned, CoreThread

if TYPE_CHECKING:
    from ._session import Session

__all__ = ["Engine"]

_LATENCY_WINDOW = 4096  # frames the latency percentiles in stats() look back over
_GROWTH_WINDOW = 64  # ticks the growth rate r is measured over


@functools.lru_cache(maxsize=4)
def _shared_model(model: str, device: str, path: str, quantize: Literal["q8_0", "q4_1"] | None = None) -> Any:
    # weights are read-only at inference: engines of the same model share them. One copy
    # per engine path ("auto" resolved first): the fused kernels pack the weights in place,
    # where the torch path cannot read them
    from metronome_engine.weights import load_model

    return load_model(model, device=device, quantize=quantize)


@functools.lru_cache(maxsize=4)
def _shared_tokenizer(model: str) -> TextTokenizer:
    from metronome_engine.tokenizer import Tokenizer

    return Tokenizer(model)


@dataclass(slots=True)
class _Pending:
    """An input frame waiting for the tick that appends it (maybe over several ticks)."""

    frame: InputFrame
    tokens: list[int]  # still to append
    submitted: float
    index: int
    started: bool = False  # a chunk of it was appended: its turn has begun


@dataclass(slots=True)
class _Entry:
    """One session's part of one tick."""

    session: Session
    pending: _Pending
    tokens: list[int]
    taken: int  # of pending.tokens
    finishes: bool  # the frame's last token is in this chunk: sample its output
    answered: bool = False  # the watchdog already answered this frame (a stuck step)
    decode: int = 1  # tokens to decode for the frame this tick (the budget's grant), when it finishes


@dataclass(slots=True)
class _WorkResult:
    seq_ids: list[int]
    outputs: list[StepOutput]  # each session's last step output (its state after the tick)
    tokens: list[tuple[int, ...]]  # each session's decoded tokens (several with extra decode rounds)
    steps: list[tuple[int, float]]  # (tokens, seconds) of each step run: what the cost model learns from
    pool: PoolStats
    step_seconds: float
    error: BaseException | None
    failures: int  # attempts that raised (retried ones included)
    raised: BaseException | None  # the last exception a try raised, even if a retry then succeeded


class Engine:
    """Serves sessions from one engine core on a metronome.

    Give ``config`` to build the embedded engine (the model loads on a worker thread
    when the engine starts), or ``core`` to serve an engine core you built (any
    ``EngineBackend``: an ``EngineCore``, a ``VLLMEngineCore``; tests, benchmarks), not
    both. ``clock`` measures per-frame latency, growth and admission
    decisions (inject one to control time in tests); ticks themselves are paced in real
    time, one every ``timing.period``. ``on_tick`` receives a ``TickReport`` after every tick.
    ``reliability`` sets the slow-consumer policy, step retries, the watchdog and when
    repeated failures shut the engine down (``ReliabilityConfig``).
    ``silent=True`` is the legacy behaviour of serving engines, kept only so benchmarks
    can show it: a stalled frame is answered on time with an empty frame instead of
    ``EngineStalled``. Never use it in an application.
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
        silent: bool = False,
        reliability: ReliabilityConfig | None = None,
    ) -> None:
        if config is not None and core is not None:
            raise ValueError("give config to build an engine or core to serve one you built, not both")
        if config is not None and not isinstance(config, EngineConfig):
            raise ValueError(f"config must be an EngineConfig, got {type(config).__name__}")
        if codec is not None and not isinstance(codec, FrameCodec):
            raise ValueError(f"codec must have encode(samples, sample_rate), got {codec!r}")
        self.config = config if core is None else None
        if self.config is None and core is None:
            self.config = EngineConfig()
        self.timing = timing or TimingConfig()
        self.admission_config = admission or AdmissionConfig()
        if reliability is not None and not isinstance(reliability, ReliabilityConfig):
            raise ValueError(f"reliability must be a ReliabilityConfig, got {type(reliability).__name__}")
        self.reliability = reliability or ReliabilityConfig()
        self.codec: FrameCodec = codec or FixedRateCodec()
        self.silent = silent
        self.metrics = EngineMetrics()
        self._core: EngineBackend | None = core
        self._tokenizer = tokenizer
        self._clock = clock
        self._on_tick = on_tick
        self._log = get_logger()
        self._admitter: AIMDAdmitter | None = None
        self._cost: StepCost | None = None  # step seconds vs tokens, measured: sizes the tick budget
        self._waited: dict[int, int] = {}  # session id -> ticks in a row it waited on the budget
        self._budget_waits = 0
        self._waiting: list[int] = []  # sessions that waited on the last tick's budget
        self._budget_now: int | None = None  # the last tick's budget
        self._slow_steps = 0
        self._session_blocks: int | None = None
        self._started = False
        self._closed = False
        self._sessions: dict[int, Session] = {}
        self._tick_done: anyio.Event | None = None  # set when the tick in flight has been delivered
        self._running = False
        self._tg: anyio.abc.TaskGroup | None = None
        self._asyncio_runner: asyncio.Task[None] | None = None
        self._events: dict[str, anyio.Event] = {}
        self._worker = CoreThread()
        self._start_lock: anyio.Lock | None = None
        # counters
        self._ticks = 0
        self._frames = 0
        self._misses = 0
        self._stalls = 0
        self._admitted = 0
        self._rejected = 0
        self._step_failures = 0
        self._failed_ticks = 0
        self._failed_in_row = 0
        self._stuck_steps = 0
        self._broken = 0
        self._shed = 0
        self._dropped = 0
        self._failure: EngineStalled | None = None  # why the engine shut itself down
        self._last_error: BaseException | None = None
        self._to_free: list[Session] = []  # sessions the engine ended in a tick: freed after it
        self._latencies: deque[float] = deque(maxlen=_LATENCY_WINDOW)
        self._growth: deque[tuple[float, int, int]] = deque(maxlen=_GROWTH_WINDOW)  # (dt, blocks, sessions)
        self._last_tick_time: float | None = None
        self._next_tick = -math.inf
        self._pool = PoolStats(num_blocks=1, used_blocks=0, block_size=1, sequences=0)

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

    async def start(self) -> None:
        """Load the model (off the event loop) and size admission. Idempotent."""
        if self._started:
            return
        if self._closed:
            raise SessionClosed("the engine is closed; make a new Engine")
        if self._start_lock is None:
            self._start_lock = anyio.Lock()
        async with self._start_lock:
            if self._started:
                return
            if self._core is None or (self._tokenizer is None and self.config is not None):
                await self._worker.call(self._load)
            samples = None
            if self.timing.tick_tokens == "auto" or self.admission_config.initial_limit is None:
                samples = await self._worker.call(self._calibrate)
            self._start_now(samples)

    def _load(self) -> None:
        cfg = self.config
        assert cfg is not None  # a core-less engine always has a config
        if self._core is None:
            import torch

            from metronome_engine.engine import resolve_kernels

            path = resolve_kernels(cfg.kernels, torch.device(cfg.device), model=cfg.model)
            model = _shared_model(cfg.model, cfg.device, path, cfg.quantize)
            pool = cfg.pool_size()
            self._core = EngineCore(
                model,
                policy=cfg.kv_policy(),
                num_blocks=pool.get("num_blocks"),
                memory_bytes=pool.get("memory_bytes"),
                block_size=cfg.block_size,
                kernels=path,  # resolved above: the engine need not resolve "auto" again
            )
        if self._tokenizer is None:
            self._tokenizer = _shared_tokenizer(cfg.model)

    def _calibrate(self) -> list[tuple[int, float]]:
        """On the core thread, before any session: a few timed steps (see ``_calibrate``)."""
        return calibrate(self._require_core(), chunk=self.timing.max_chunk_tokens)

    def _start_now(self, samples: list[tuple[int, float]] | None = None) -> None:
        core = self._require_core()
        chunk = self.timing.max_chunk_tokens
        bound = core.session_bound_blocks(chunk=chunk)
        pool = core.pool_stats()
        if bound is not None and bound > pool.num_blocks:
            raise ValueError(
                f"max_chunk_tokens={chunk} widens a session's bound to {bound} blocks, more than the pool's "
                f"{pool.num_blocks}; lower TimingConfig.max_chunk_tokens or grow the pool"
            )
        self._session_blocks = bound
        guard = MemoryGuard(pool_blocks=pool.num_blocks, session_blocks=bound)
        self._cost = StepCost(samples or ())
        budget, fits = self._tick_budget(), self._measured_tokens()
        measured = None if fits is None else max(1, fits // self.admission_config.session_tokens)
        self._admitter = AIMDAdmitter(
            self.admission_config,
            deadline=self.timing.frame_deadline,
            guard=guard,
            clock=self._clock,
            measured=measured,
        )
        if samples:
            self._log.info(
                "engine.calibrated",
                fixed_ms=round(self._cost.fixed * 1e3, 3),
                per_token_ms=round(self._cost.per_token * 1e3, 4),
                tick_tokens=budget,
                measured_limit=measured,
                limit=self._admitter.limit,
            )
        self._pool = pool
        self._events = {"wake": anyio.Event(), "room": anyio.Event(), "idle": anyio.Event()}
        self._events["idle"].set()
        self.metrics.limit.set(self._admitter.limit)
        self._started = True
        self._log.info("engine.started", policy=repr(core.policy), pool_blocks=pool.num_blocks, session_blocks=bound)

    def _require_core(self) -> EngineBackend:
        if self._core is None:
            raise RuntimeError("the engine has not loaded its model yet; enter it first (async with engine)")
        return self._core

    def _require_admitter(self) -> AIMDAdmitter:
        if self._admitter is None:
            raise RuntimeError("the engine has not started; enter it first (async with engine)")
        return self._admitter

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
    def failure(self) -> EngineStalled | None:
        """Why the engine shut itself down (repeated step failures), or ``None``."""
        return self._failure

    async def aclose(self) -> None:
        """Close every session (later use raises ``SessionClosed``) and return all blocks.

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
            sessions = list(self._sessions.values())
            self._sessions.clear()
            if failure is None:
                for s in sessions:
                    s._closed_by_engine()
            if self._started:
                self._set("wake")
                self._set("room")
                if failure is None:
                    await self._events["idle"].wait()  # the tick in flight finishes (or is abandoned)
                for s in [*sessions, *self._drain_to_free()]:
                    await self._free(s)
                self.metrics.sessions.set(0)
                self.metrics.occupancy.set(self._pool.occupancy)
            await self._worker.aclose()
            if failure is not None:
                # told last, so that a session that hears of the failure finds the engine shut down
                for s in sessions:
                    for p in s._queue:  # every frame sent gets its answer
                        s._deliver(self._engine_failed(s, failure, p.frame))
                    s._end(self._engine_failed(s, failure, None))
            self.metrics.close()
            self._log.info("engine.closed", sessions=len(sessions), failed=failure is not None)

    @staticmethod
    def _engine_failed(s: Session, failure: EngineStalled, frame: InputFrame | None) -> EngineStalled:
        err = EngineStalled(str(failure), session_id=s.id, reason="engine_failed", frame=frame)
        err.__cause__ = failure.__cause__
        return err

    # sessions ------------------------------------------------------------------------------------

    def session(
        self,
        system_prompt: str | None = None,
        *,
        sampling: SamplingParams | None = None,
        timeout: float | None = None,
        decode_tokens: int = 1,
        pin_system_prompt: bool = True,
    ) -> Session:
        """A session on this engine, opened by ``async with`` (waits up to ``timeout`` for room)."""
        from ._session import Session

        return Session(
            system_prompt,
            engine=self,
            sampling=sampling,
            timeout=timeout,
            decode_tokens=decode_tokens,
            pin_system_prompt=pin_system_prompt,
        )

    def try_session(
        self,
        system_prompt: str | None = None,
        *,
        sampling: SamplingParams | None = None,
        decode_tokens: int = 1,
        pin_system_prompt: bool = True,
    ) -> Session:
        """Open a session now or raise ``AdmissionRejected`` at once: the nowait twin of ``session()``."""
        return self.session(
            system_prompt, sampling=sampling, decode_tokens=decode_tokens, pin_system_prompt=pin_system_prompt
        ).open_nowait()

    async def _open(self, session: Session, timeout: float | None) -> None:
        await self.start()
        wait = self.admission_config.queue_timeout if timeout is None else timeout
        if wait < 0 or not math.isfinite(wait):
            raise ValueError(f"timeout must be a finite number >= 0 (seconds), got {timeout!r}")
        give_up = anyio.current_time() + wait  # waiting is real time, whatever clock measures latency
        while not self._try_admit(session):
            remaining = give_up - anyio.current_time()
            if remaining <= 0:
                raise self._reject(session)
            room = self._event("room")
            with anyio.move_on_after(remaining):
                await room.wait()

    def _open_nowait(self, session: Session) -> None:
        if not self._started:
            if self._core is None or (self._tokenizer is None and self.config is not None):
                raise RuntimeError("the engine has not loaded its model yet; enter it first (async with engine)")
            self._start_now()
        if not self._try_admit(session):
            raise self._reject(session)

    def _try_admit(self, session: Session) -> bool:
        if self._failure is not None:
            raise self._engine_failed(session, self._failure, None)
        if self._closed:
            raise SessionClosed("the engine is closed; no session can open on it", session_id=session.id)
        admitter = self._require_admitter()
        prefix = self._encode_system(session)
        memory, pinned_blocks = self._pin(session, len(prefix))
        held = sum(s._pinned_blocks for s in self._sessions.values()) + pinned_blocks
        free = self._pool.num_blocks - self._pool.used_blocks
        if not admitter.admits(len(self._sessions), free_blocks=free, pinned_blocks=held):
            return False
        session._attach(self, prefix, memory, pinned_blocks)
        self._sessions[session.id] = session
        self._admitted += 1
        self.metrics.admitted.inc()
        self.metrics.sessions.set(len(self._sessions))
        session._log.info("admission.admitted", in_flight=len(self._sessions), limit=admitter.limit)
        return True

    def _pin(self, session: Session, prompt_tokens: int) -> tuple[ConversationMemory, int]:
        """The session's memory account, and the blocks its pinned prompt adds to its bound;
        ``CacheExhausted`` when the pool could never hold that bound."""
        core = self._require_core()
        pinned = prompt_tokens if session._pin_system_prompt and core.policy.bounded else 0
        memory = ConversationMemory(core.policy, prompt_tokens=prompt_tokens, pinned=pinned)
        if not pinned or self._session_blocks is None:
            return memory, 0
        try:
            bound = core.session_bound_blocks(chunk=self.timing.max_chunk_tokens, pinned=pinned)  # type: ignore[call-arg]
        except TypeError:  # a backend without pinned prefixes: the prompt slides, and the session says so
            session._log.warning("session.prompt_not_pinned", backend=type(core).__name__, prompt_tokens=prompt_tokens)
            return ConversationMemory(core.policy, prompt_tokens=prompt_tokens), 0
        assert bound is not None  # bounded policy
        pool = self._pool.num_blocks
        if bound > pool:
            raise CacheExhausted(
                f"session {session.id} pins a {pinned}-token system prompt: its bound is {bound} blocks, more than "
                f"the pool's {pool}; shorten the prompt, pass pin_system_prompt=False, or grow the pool",
                session_id=session.id,
                needed_blocks=bound,
                pool_blocks=pool,
            )
        return memory, bound - self._session_blocks

    def _reject(self, session: Session) -> AdmissionRejected:
        admitter = self._require_admitter()
        admitter.record_rejection()
        self._rejected += 1
        self.metrics.rejected.inc()
        limit, in_flight, retry_after = admitter.limit, len(self._sessions), admitter.retry_after()
        self._log.warning(
            "admission.rejected", session_id=session.id, limit=limit, in_flight=in_flight, retry_after=retry_after
        )
        return AdmissionRejected(
            f"the engine is at its session cap ({in_flight} of {limit} open); retry after {retry_after:.2f} s",
            retry_after=retry_after,
            limit=limit,
            in_flight=in_flight,
            session_id=session.id,
        )

    async def _close_session(self, session: Session) -> None:
        """Forget ``session`` and return its blocks to the pool before returning."""
        if self._sessions.pop(session.id, None) is None:
            return  # never admitted, or the engine closed it and freed its blocks
        self._waited.pop(session.id, None)
        self.metrics.sessions.set(len(self._sessions))
        self._set("room")
        self._wake()  # the tick loop rests when the last session has gone
        await self._free(session)

    async def _free(self, session: Session) -> None:
        # a tick in flight may be opening this session's sequence: let it finish (or be abandoned) first
        while session._in_tick and self._tick_done is not None:
            await self._tick_done.wait()
        seq_id, session._seq_id = session._seq_id, None
        if seq_id is None:
            return
        core = self._require_core()
        try:
            # on the core thread, queued behind any step: never while one runs
            self._pool = await self._worker.call(self._free_sequence, core, seq_id)
        except CoreAbandoned:
            return  # the core went with its stuck thread; its blocks go with it
        self.metrics.occupancy.set(self._pool.occupancy)

    def _drain_to_free(self) -> list[Session]:
        ended, self._to_free = self._to_free, []
        return ended

    @staticmethod
    def _free_sequence(core: EngineBackend, seq_id: int) -> PoolStats:
        core.free_sequence(seq_id)
        return core.pool_stats()

    # input ---------------------------------------------------------------------------------------

    def _encode_system(self, session: Session) -> list[int]:
        prompt = session._system_prompt
        if prompt is None:
            return []
        tok = self._require_tokenizer("a system prompt")
        session._rendered = True
        return chat_turn(tok, "system", prompt, first=True, generation_prompt=False)

    def _require_tokenizer(self, what: str) -> TextTokenizer:
        if self._tokenizer is None:
            raise ValueError(f"{what} needs a tokenizer; pass tokenizer= to Engine, or send token or audio frames")
        return self._tokenizer

    def _encode(self, session: Session, frame: InputFrame) -> list[int]:
        """The tokens ``frame`` appends. Checked here so one bad frame cannot break a shared step."""
        if frame.text:
            tok = self._require_tokenizer("a text frame")
            ids = chat_turn(tok, "user", frame.text, first=not session._rendered, generation_prompt=True)
            session._rendered = True
            source = "the tokenizer"
        elif frame.audio is not None:
            assert frame.sample_rate is not None
            source = f"the codec {self.codec!r}"
            try:
                ids = list(self.codec.encode(frame.samples_float32(), frame.sample_rate))
            except Exception as exc:  # a custom codec's bug must not escape as anything but bad input
                raise ValueError(f"audio: {source} could not encode the frame ({exc!r}); nothing was queued") from exc
        elif frame.tokens is not None:
            ids = list(frame.tokens)
            source = "the frame"
        else:
            ids = []
            source = "the frame"
        vocab = self._require_core().config.vocab_size
        for t in ids:
            if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab:
                field = "tokens holds" if frame.tokens is not None else f"{source} produced token"
                raise ValueError(f"{field} {t!r}, outside the model's vocabulary [0, {vocab}); nothing was queued")
        return ids

    def _submit(self, session: Session, frame: InputFrame) -> None:
        cap = self.reliability.input_queue
        if len(session._queue) >= cap:
            # refused before anything changes: the accepted frames keep their place and answers
            self.metrics.faults.labels("input_refused").inc()
            admitter = self._require_admitter()
            raise Overloaded(
                f"session {session.id} has {cap} frames waiting (ReliabilityConfig.input_queue): it sends faster "
                "than the engine ticks, one frame per session per tick; read outputs as they come and send "
                "again after retry_after",
                retry_after=self.timing.period,
                limit=admitter.limit,
                in_flight=len(self._sessions),
                session_id=session.id,
            )
        tokens = self._encode(session, frame)
        if session._prefix:
            tokens = session._prefix + tokens
            session._prefix = []
        if not tokens and session._frames_sent == 0:
            raise ValueError(
                "the first frame of a session must carry input (text, audio or tokens) or follow a system prompt"
            )
        session._queue.append(_Pending(frame, tokens, self._clock(), session._frames_sent))
        session._frames_sent += 1
        self._wake()
        self._ensure_runner()

    # the tick loop -------------------------------------------------------------------------------

    def _event(self, name: str) -> anyio.Event:
        """The current event ``name``, renewed once it has fired (anyio events cannot be cleared)."""
        ev = self._events[name]
        if ev.is_set():
            ev = self._events[name] = anyio.Event()
        return ev

    def _set(self, name: str) -> None:
        self._events[name].set()

    def _wake(self) -> None:
        self._set("wake")

    def _has_work(self) -> bool:
        return any(s._queue for s in self._sessions.values())

    def _ensure_runner(self) -> None:
        """Start the tick loop if it is not running: it runs while there is work or sessions."""
        if self._running or self._closed:
            return
        self._running = True
        self._event("idle")  # not idle from here on
        if self._tg is not None:
            self._tg.start_soon(self._tick_loop)
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            self._running = False
            raise RuntimeError("an engine not entered with `async with` runs only under asyncio") from None
        self._asyncio_runner = loop.create_task(self._tick_loop())

    async def _tick_loop(self) -> None:
        try:
            while not self._closed:
                if not self._has_work():
                    if not self._sessions:
                        break  # idle: the next session starts the loop again
                    wake = self._event("wake")
                    if not self._has_work():
                        await wake.wait()
                    continue
                frames_due = any(s._queue for s in self._sessions.values())
                delay = self._next_tick - anyio.current_time()
                if frames_due and delay > 0:
                    await anyio.sleep(delay)  # the metronome: at most one tick per period
                    continue
                with anyio.CancelScope(shield=True):
                    await self._tick()
                    if self._failed_in_row >= self.reliability.max_failed_ticks and not self._closed:
                        await self._fail()
        finally:
            self._running = False
            self._asyncio_runner = None
            self._set("idle")

    def _tick_budget(self) -> int | None:
        """Most tokens one tick appends (``TimingConfig.tick_tokens``); ``None``: no cap."""
        fixed = self.timing.tick_tokens
        if fixed != "auto":
            return fixed
        measured = self._measured_tokens()
        return max(1, measured) if measured is not None else self.timing.max_chunk_tokens  # unmeasured: one chunk

    def _measured_tokens(self) -> int | None:
        """The tokens a tick appends within ``step_share`` of the deadline, by the measured cost."""
        cost = self._cost
        if cost is None or not cost.ready:
            return None
        return cost.tokens_within(self.timing.step_share * self.timing.frame_deadline)

    def _gather(self) -> list[_Entry]:
        """This tick's chunk of every session with input, within the tick's token budget."""
        heads: dict[int, tuple[Session, list[int]]] = {}
        demands = []
        for s in self._sessions.values():
            if not s._queue:
                continue
            head = [s._feedback] if s._feedback is not None else []
            if not head and not s._queue[0].tokens:
                s._queue.popleft()
                self._push(s, ValueError("nothing to decode from: the session has appended nothing yet; send input"))
                continue
            heads[s.id] = (s, head)
            need = len(head) + len(s._queue[0].tokens)
            demands.append(Demand(s.id, need, s.decode_tokens, s._frames_out > 0, self._waited.get(s.id, 0)))
        cost = self._cost
        step_cost = cost.step_tokens() if cost is not None and cost.ready else 0
        chunk = self.timing.max_chunk_tokens
        budget = self._tick_budget()
        if budget is not None:
            # a talking session's frame is never split by the budget: on a machine too slow for the deadline
            # splitting it would only double its latency (admission keeps such sessions few)
            beat = max((min(d.input, chunk) for d in demands if d.talking), default=0)
            budget = max(budget, beat)
        self._budget_now = budget
        plan = plan_tick(demands, budget=budget, max_chunk=chunk, step_cost=step_cost)
        entries = []
        self._waiting = []
        for sid, (s, head) in heads.items():
            grant = plan[sid]
            if grant.chunk == 0:  # waits on the budget this tick: counted, and first in line soon
                self._waited[sid] = self._waited.get(sid, 0) + 1
                self._budget_waits += 1
                self._waiting.append(sid)
                continue
            self._waited.pop(sid, None)
            pending = s._queue[0]
            tokens = (head + pending.tokens)[: grant.chunk]
            taken = grant.chunk - len(head)
            entries.append(_Entry(s, pending, tokens, taken, grant.decode > 0, decode=grant.decode))
        return entries

    def _work(self, entries: list[tuple[int | None, SamplingParams | None, list[int], bool, int, int]]) -> _WorkResult:
        """On the core thread: open the sequences of new sessions, run one batched step,
        then the extra decode rounds of sessions granted several tokens this tick.

        A step that raises has changed nothing (the core rolls back), so it is retried at
        once, ``step_retries`` times: a transient fault costs one step's time, not a frame.
        """
        core = self._require_core()
        seq_ids = [
            sid if sid is not None else core.add_sequence(sampling=sampling, **({"pinned": pin} if pin else {}))
            for sid, sampling, *_, pin in entries
        ]
        requests = [
            StepRequest(sid, toks, sample=finish)
            for sid, (_, _, toks, finish, *_) in zip(seq_ids, entries, strict=True)
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
        steps = [(sum(len(r.tokens) for r in requests), time.perf_counter() - t0)] if error is None else []
        tokens: list[tuple[int, ...]] = [(o.token,) if o.token is not None else () for o in outputs]
        if error is None:
            outputs = self._decode_rounds(core, seq_ids, [e[4] for e in entries], outputs, tokens, steps)
        seconds = time.perf_counter() - t0
        return _WorkResult(seq_ids, outputs, tokens, steps, core.pool_stats(), seconds, error, failures, raised)

    def _decode_rounds(
        self,
        core: EngineBackend,
        seq_ids: list[int],
        decode: list[int],
        outputs: list[StepOutput],
        tokens: list[tuple[int, ...]],
        steps: list[tuple[int, float]],
    ) -> list[StepOutput]:
        """Extra decode rounds (on the core thread): each appends a session's last token and samples the next.

        A session leaves the rounds at its stop token, or when the pool cannot take its token
        (it keeps what it decoded; the token goes back with its next frame, as always). A
        round that raises changed nothing: the rounds end there, the tokens so far stand.
        """
        stop = self._tokenizer.stop_ids if self._tokenizer is not None else frozenset()
        outputs = list(outputs)
        going = [i for i, n in enumerate(decode) if n > 1 and tokens[i] and tokens[i][-1] not in stop]
        done = 1
        while going:
            t0 = time.perf_counter()
            try:
                outs = core.step([StepRequest(seq_ids[i], [tokens[i][-1]], sample=True) for i in going])
            except Exception as exc:  # the frame keeps the tokens decoded so far
                self._log.warning("engine.decode_round_failed", error=repr(exc), round=done)
                break
            steps.append((len(going), time.perf_counter() - t0))
            done += 1
            still = []
            for i, out in zip(going, outs, strict=True):
                if out.stall is Stall.NUMERIC_FAULT:
                    outputs[i] = out  # the core dropped the session: it breaks, as in the main step
                    continue
                if out.stall is not None or out.token is None:
                    continue  # the pool is full: no more this tick
                outputs[i] = out
                tokens[i] = (*tokens[i], out.token)
                if decode[i] > done and out.token not in stop:
                    still.append(i)
            going = still
        return outputs

    async def _tick(self) -> None:
        entries = self._gather()
        if not entries:
            return
        start, period = anyio.current_time(), self.timing.period
        # keep the metronome's phase unless a whole period was lost (idle, or a slow step)
        base = self._next_tick if start - self._next_tick < period else start
        self._next_tick = base + period
        for e in entries:
            e.session._in_tick = True
        self._tick_done = done_event = anyio.Event()
        try:
            work = [
                (e.session._seq_id, e.session._sampling, e.tokens, e.finishes, e.decode, e.session._pinned)
                for e in entries
            ]
            job = self._worker.submit(self._work, work)
            limit = max(self.reliability.watchdog * self.timing.frame_deadline, self.reliability.watchdog_floor)
            expected = self._expected_seconds(entries)
            stuck = 0
            cpu0 = last_cpu = self._worker.cpu_seconds()
            last_running = 0.0

            def on_long(times: int, running: float) -> bool:
                # slow or stuck: is the core thread still working (CPU time), within what its tokens take?
                nonlocal stuck, last_cpu, last_running
                cpu = self._worker.cpu_seconds()
                worked = None if cpu is None or cpu0 is None else cpu - cpu0
                recent = None if cpu is None or last_cpu is None else cpu - last_cpu
                window, last_cpu, last_running = running - last_running, cpu, running
                verdict = judge(
                    worked=worked, recent=recent, window=window, expected=expected, slack=self.reliability.watchdog
                )
                if not stuck and verdict is Verdict.SLOW:
                    self._on_slow(entries, times, running, expected)
                    return True
                stuck += 1
                return self._on_stuck(entries, stuck, running, limit)

            returned = await watch(
                job,
                clock=anyio.current_time,  # real time, as the metronome paces ticks: a stuck thread is wall-clock
                limit=limit,
                poll=min(period, limit / 4),
                on_stuck=on_long,
                give_up=lambda times: times > 0 and self._closed,  # closing: never wait on a stuck step
            )
            if not returned:
                self._worker.abandon()
                self._log.error("engine.core_abandoned", stuck_ticks=self._failed_in_row)
                return
            result = job.outcome()
            self._pool = result.pool
            self.metrics.occupancy.set(result.pool.occupancy)
            self._finish(entries, result, self._clock())
        finally:
            for e in entries:
                e.session._in_tick = False
            done_event.set()
        for s in self._drain_to_free():
            await self._free(s)

    async def _fail(self) -> None:
        """Too many failed ticks in a row: shut the engine down, loudly, for every session."""
        n = self._failed_in_row
        last = self._last_error
        what = f"the last step raised {last!r}" if last is not None else "the last step is stuck"
        failure = EngineStalled(
            f"the engine shut down after {n} failed ticks in a row ({what}); make a new Engine",
            reason="engine_failed",
        )
        failure.__cause__ = last
        self._failure = failure
        self.metrics.faults.labels("engine_failed").inc()
        self._log.error("engine.failed", failed_ticks=n, error=repr(last))
        await self._shut_down(failure)

    def _expected_seconds(self, entries: list[_Entry]) -> float | None:
        """What this tick's step should take at the slowest rate measured (``None``: nothing measured)."""
        cost = self._cost
        if cost is None or not cost.ready:
            return None
        tokens = sum(len(e.tokens) + max(0, e.decode - 1) for e in entries)
        rounds = max((e.decode - 1 for e in entries), default=0)
        return (cost.seconds(tokens) + rounds * cost.fixed) * cost.slowest()

    def _on_slow(self, entries: list[_Entry], times: int, running: float, expected: float | None) -> None:
        """A long step that is still within its tokens' cost: not stuck. Shed load so the next ticks fit.

        Each watchdog period it runs cuts the admission cap; from the second on, the session
        admitted last among the step's is shed with ``LoadShed`` (never the last one open).
        """
        if times == 1:
            self._slow_steps += 1
            self.metrics.faults.labels("step_slow").inc()
        admitter = self._require_admitter()
        before, limit = admitter.limit, admitter.cut()
        self.metrics.limit.set(limit)
        self._log.warning("engine.step_slow", running=running, expected=expected, old_limit=before, limit=limit)
        order = {sid: i for i, sid in enumerate(self._sessions)}
        live = [e.session for e in entries if e.session.id in order]
        if times < 2 or len(self._sessions) < 2 or not live:
            return
        victim = max(live, key=lambda s: order[s.id])
        self._end_session(
            victim,
            LoadShed(
                f"session {victim.id} was shed: a step ran {running:.2f} s, past the watchdog's limit, on a machine "
                "that cannot hold this load at the deadline; open a new session after retry_after",
                retry_after=admitter.retry_after(),
                limit=limit,
                in_flight=len(self._sessions),
                session_id=victim.id,
            ),
            "shed",
        )
        self._shed += 1

    def _on_stuck(self, entries: list[_Entry], times: int, running: float, limit: float) -> bool:
        """The watchdog: the step has run ``times * limit`` seconds. Answer what waits on it; keep waiting?"""
        if times == 1:
            self._stuck_steps += 1
            self._last_error = None
            self.metrics.faults.labels("step_stuck").inc()
        self._count_failed_tick()
        self._log.error("engine.step_stuck", running=running, limit=limit, failed_in_row=self._failed_in_row)
        for e in entries:
            s = e.session
            if e.answered or s._closed or not s._queue or s._queue[0] is not e.pending:
                continue
            e.answered = True
            s._queue.popleft()
            why = f"its step has run {running:.2f} s, past the watchdog's {limit:.2f} s"
            self._stalled(s, e.pending, "step_stuck", why)
        # frames queued behind the stuck step get their answer too: no step will serve them soon
        in_tick = {id(e.pending) for e in entries}
        for s in list(self._sessions.values()):
            while s._queue and id(s._queue[0]) not in in_tick:
                p = s._queue.popleft()
                self._stalled(s, p, "step_stuck", f"the engine's step has been stuck for {running:.2f} s")
        return self._failed_in_row < self.reliability.max_failed_ticks

    def _stalled(self, s: Session, p: _Pending, reason: str, why: str, cause: BaseException | None = None) -> None:
        s._stalls += 1
        self._stalls += 1
        self.metrics.stalls.inc()
        err = EngineStalled(
            f"frame {p.index} of session {s.id} was not served: {why}", session_id=s.id, reason=reason, frame=p.frame
        )
        err.__cause__ = cause
        s._log.warning("session.stalled", reason=reason, frame=p.index)
        self._push(s, err)

    def _count_failed_tick(self) -> None:
        self._failed_ticks += 1
        self._failed_in_row += 1

    # delivery under the slow-consumer policy --------------------------------------------------------

    def _push(self, s: Session, item: OutputFrame | BaseException) -> None:
        """Hand ``item`` to ``s`` within its bounded output queue."""
        if s._closed:
            return
        cap = self.reliability.output_queue
        if len(s._outputs) < cap:
            s._deliver(item)
            return
        if self.reliability.slow_consumer == "drop_oldest":
            s._outputs.popleft()
            s._dropped += 1
            self._dropped += 1
            self.metrics.faults.labels("output_dropped").inc()
            if s._dropped == 1 or s._dropped % cap == 0:  # a slow reader is one event per queue-full, not per frame
                s._log.warning("session.outputs_dropped", dropped=s._dropped, output_queue=cap)
            s._deliver(item)
            return
        admitter = self._require_admitter()
        limit, in_flight, retry_after = admitter.limit, len(self._sessions), admitter.retry_after()
        self._end_session(
            s,
            LoadShed(
                f"session {s.id} was shed: it left {cap} outputs unread (ReliabilityConfig.output_queue); read "
                "outputs as they come, or use slow_consumer='drop_oldest'; open a new session after retry_after",
                retry_after=retry_after,
                limit=limit,
                in_flight=in_flight,
                session_id=s.id,
            ),
            "shed",
        )
        self._shed += 1

    def _end_session(self, s: Session, error: MetronomeError, kind: str) -> None:
        """The engine ends ``s``: out of the admitted set now, its blocks freed after the tick."""
        if self._sessions.pop(s.id, None) is None:
            return
        self._waited.pop(s.id, None)
        self.metrics.faults.labels(kind).inc()
        self.metrics.sessions.set(len(self._sessions))
        s._end(error)
        self._to_free.append(s)
        self._set("room")

    def _finish(self, entries: list[_Entry], result: _WorkResult, done: float) -> None:
        if self._cost is not None:
            for tokens, seconds in result.steps:  # the budget follows the machine
                self._cost.observe(tokens, seconds)
        tick = self._ticks
        self._ticks += 1
        latencies: list[float] = []
        stalled: list[int] = []
        growth = 0
        self._step_failures += result.failures
        if result.failures:
            self.metrics.faults.labels("step_failed").inc(result.failures)
            self._log.error(
                "engine.step_failed", tries=result.failures, error=repr(result.raised), recovered=result.error is None
            )
        if result.error is not None:
            self._last_error = result.error
            self._count_failed_tick()
        else:
            self._failed_in_row = 0
        for i, e in enumerate(entries):
            s = e.session
            s._seq_id = result.seq_ids[i]
            if s._closed and not s._by_engine:
                continue  # closed while its step ran: its closer frees the sequence
            if result.error is not None:
                if not e.answered and not s._closed:
                    s._queue.popleft()
                    why = f"the step failed {result.failures} times ({result.error!r}); nothing was appended"
                    self._stalled(s, e.pending, "step_failed", why, result.error)
                continue
            out = result.outputs[i]
            if out.stall is Stall.NUMERIC_FAULT:
                self._break(s, e)
                continue
            if s._closed:
                continue  # ended by the engine in this tick (shed): freed after it
            if e.answered:  # a stuck step that came back: keep the state, the frame was answered
                if out.stall is None:
                    s._num_tokens, s._num_blocks = out.num_tokens, out.num_blocks
                    s._feedback = result.tokens[i][-1] if e.finishes and result.tokens[i] else None
                continue
            if out.stall is not None:
                stalled.append(s.id)
                latency = self._stall(s, e, out, tick, done)
                if latency is not None:
                    latencies.append(latency)
                continue
            growth += out.num_blocks - s._num_blocks
            self._remember(s, e, out.num_tokens)
            s._num_tokens, s._num_blocks = out.num_tokens, out.num_blocks
            s._feedback = None
            del e.pending.tokens[: e.taken]
            if e.finishes:
                s._queue.popleft()
                decoded = result.tokens[i]
                assert decoded
                s._feedback = decoded[-1]
                latencies.append(self._answer(s, e.pending, decoded, tick, done))
        appended = sum(t for t, _ in result.steps)
        self._account(tick, done, entries, stalled, latencies, growth, result.step_seconds, appended)

    def _remember(self, s: Session, e: _Entry, num_tokens: int) -> None:
        """Keep the account of what the session's model still sees (docs/sessions.md): say
        when the window drops a whole turn or the system prompt, count every token it drops."""
        memory = s._memory
        if memory is None:
            return
        if not e.pending.started and e.taken:  # a frame with input begins its turn after the fed-back token
            memory.turn_started(s._num_tokens + len(e.tokens) - e.taken)
        e.pending.started = True
        lost = memory.update(num_tokens)
        if lost.tokens:
            self.metrics.evicted_tokens.inc(lost.tokens)
        if lost.turns or lost.prompt:
            s._log.info(
                "session.evicted",
                evicted_tokens=memory.evicted_tokens,
                turns_lost=lost.turns,
                oldest_resident_turn=memory.oldest_resident_turn,
                system_prompt_resident=memory.prompt_resident,
            )

    def _break(self, s: Session, e: _Entry) -> None:
        """Non-finite logits: the session's state is corrupt. The core dropped it; end the session."""
        s._seq_id = None  # the core freed the sequence (and scrubbed its blocks) already
        s._num_blocks = 0
        self._broken += 1
        s._log.error("session.broken", reason="numeric_fault", frame=e.pending.index)
        self._end_session(
            s,
            SessionBroken(
                f"session {s.id} is broken: its logits came out NaN or inf at frame {e.pending.index}, so its cache "
                "is corrupt; the engine dropped it and freed its blocks; open a new session",
                session_id=s.id,
                reason="numeric_fault",
            ),
            "numeric_fault",
        )

    def _answer(self, s: Session, pending: _Pending, tokens: tuple[int, ...], tick: int, done: float) -> float:
        latency = done - pending.submitted
        deadline = self.timing.frame_deadline
        missed = latency > deadline
        tok = self._tokenizer
        text = tok.decode(list(tokens)) if tok is not None and tokens else ""
        stop = tok is not None and any(t in tok.stop_ids for t in tokens)
        out = OutputFrame(
            session_id=s.id,
            index=pending.index,
            tick=tick,
            tokens=tokens,
            text=text,
            latency=latency,
            deadline_missed=missed,
            stop=stop,
        )
        s._frames_out += 1
        self._frames += 1
        self.metrics.frames.inc()
        self.metrics.frame_latency.observe(latency)
        self._latencies.append(latency)
        self._require_admitter().observe(latency)
        if missed:
            s._misses += 1
            self._misses += 1
            self.metrics.deadline_misses.inc()
        if missed and self.timing.strict:
            self._push(
                s,
                DeadlineMissed(
                    f"frame {pending.index} of session {s.id} took {latency * 1e3:.1f} ms, "
                    f"past its {deadline * 1e3:.1f} ms deadline",
                    session_id=s.id,
                    latency=latency,
                    deadline=deadline,
                    output=out,
                ),
            )
        else:
            self._push(s, out)
        return latency

    def _stall(self, s: Session, e: _Entry, out: StepOutput, tick: int, done: float) -> float | None:
        """The pool could not take this chunk: nothing was appended. Tell the session, never go silent."""
        s._queue.popleft()  # the frame is handed back in the error; the session may send it again
        s._stalls += 1
        self._stalls += 1
        self.metrics.stalls.inc()
        core = self._require_core()
        pool = core.pool_stats()
        block_size, pool_blocks = pool.block_size, pool.num_blocks
        needed = math.ceil((out.num_tokens + len(e.tokens)) / block_size)
        reason = out.stall.value if out.stall is not None else "unknown"
        exhausted = self._session_blocks is None and needed > pool_blocks
        s._log.warning(
            "session.stalled",
            reason=reason,
            tick=tick,
            frame=e.pending.index,
            num_tokens=out.num_tokens,
            used_blocks=self._pool.used_blocks,
            pool_blocks=pool_blocks,
            cache_exhausted=exhausted,
        )
        if self.silent:  # the legacy cliff: an empty frame, on time, that looks healthy
            return self._answer(s, e.pending, (), tick, done)
        if exhausted:
            self._push(
                s,
                CacheExhausted(
                    f"session {s.id} needs {needed} blocks for {out.num_tokens + len(e.tokens)} tokens, more than "
                    f"the pool's {pool_blocks}; grow the pool or use kv='window' to bound each session",
                    session_id=s.id,
                    needed_blocks=needed,
                    pool_blocks=pool_blocks,
                ),
            )
        else:
            self._push(
                s,
                EngineStalled(
                    f"frame {e.pending.index} of session {s.id} was not served: the KV pool is full "
                    f"({self._pool.used_blocks} of {pool_blocks} blocks); close sessions or use kv='window'",
                    session_id=s.id,
                    reason=reason,
                    frame=e.pending.frame,
                ),
            )
        return None

    def _account(
        self,
        tick: int,
        done: float,
        entries: Sequence[_Entry],
        stalled: list[int],
        latencies: list[float],
        growth: int,
        step_seconds: float,
        tokens: int = 0,
    ) -> None:
        if self._last_tick_time is not None:
            self._growth.append((done - self._last_tick_time, growth, len(self._sessions)))
        self._last_tick_time = done
        admitter = self._require_admitter()
        before = admitter.limit
        limit = admitter.update(len(self._sessions))
        if limit != before:
            self._log.info("admission.limit_changed", old=before, new=limit, in_flight=len(self._sessions))
            if limit > before:
                self._set("room")
        self.metrics.limit.set(limit)
        self.metrics.occupancy.set(self._pool.occupancy)
        t_sat = self._t_sat()
        self.metrics.t_sat.set(math.inf if t_sat is None else t_sat)
        if self._on_tick is not None:
            report = TickReport(
                tick=tick,
                time=done,
                sessions=len(self._sessions),
                served=len(entries) - len(stalled),
                stalled=tuple(stalled),
                latencies=tuple(latencies),
                step_seconds=step_seconds,
                used_blocks=self._pool.used_blocks,
                pool_blocks=self._pool.num_blocks,
                tokens=tokens,
                waiting=tuple(self._waiting),
                tick_tokens=self._budget_now,
            )
            try:
                self._on_tick(report)
            except Exception:  # an observer must not stop the metronome
                self._log.exception("engine.on_tick_failed", tick=tick)

    # observability -------------------------------------------------------------------------------

    def _growth_rate(self) -> float:
        session_seconds = sum(dt * n for dt, _, n in self._growth)
        if session_seconds <= 0:
            return 0.0
        return max(0.0, sum(g for _, g, _ in self._growth) / session_seconds)

    def _t_sat(self) -> float | None:
        if self._session_blocks is not None:
            return None  # bounded sessions: the memory guard keeps the pool from ever filling
        r, n = self._growth_rate(), len(self._sessions)
        if r <= 0 or n == 0:
            return None
        # r is blocks per second per session: the free blocks, not the free fraction, run out
        return max(0.0, (self._pool.num_blocks - self._pool.used_blocks) / (n * r))

    def stats(self) -> EngineStats:
        admitter = self._admitter
        lat = list(self._latencies)
        guard_limit = admitter.guard.limit if admitter is not None and admitter.guard is not None else None
        return EngineStats(
            sessions=len(self._sessions),
            limit=admitter.limit if admitter is not None else self.admission_config.initial_limit or UNMEASURED_LIMIT,
            memory_limit=guard_limit,
            admitted=self._admitted,
            rejected=self._rejected,
            pool_blocks=self._pool.num_blocks if self._started else 0,
            used_blocks=self._pool.used_blocks,
            occupancy=self._pool.occupancy if self._started else 0.0,
            ticks=self._ticks,
            frames=self._frames,
            latency_p50=percentile(lat, 0.5) if lat else None,
            latency_p95=percentile(lat, 0.95) if lat else None,
            latency_p99=percentile(lat, 0.99) if lat else None,
            deadline=self.timing.frame_deadline,
            deadline_misses=self._misses,
            stalls=self._stalls,
            growth_rate=self._growth_rate(),
            t_sat=self._t_sat(),
            step_failures=self._step_failures,
            failed_ticks=self._failed_ticks,
            stuck_steps=self._stuck_steps,
            broken=self._broken,
            shed=self._shed,
            outputs_dropped=self._dropped,
            failed=self._failure is not None,
            tick_tokens=self._tick_budget() if self._started else None,
            budget_waits=self._budget_waits,
            slow_steps=self._slow_steps,
        )

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("started" if self._started else "new")
        policy = repr(self._core.policy) if self._core is not None else repr(self.config)
        return f"Engine({policy}, sessions={len(self._sessions)}, {state})"
