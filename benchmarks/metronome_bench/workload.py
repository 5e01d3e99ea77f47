"""The load the paper's experiments put on an engine: sessions streaming frames on a real-time grid.

A session arrives, streams one frame of ``tokens_per_frame`` tokens every ``period`` seconds
for its duration (a constant token rate, as an interaction model's audio frames are), then
leaves. Arrivals and durations come from a seeded generator, so a run is repeatable.

Frames are sent on the engine's metronome: ``lead`` seconds before the tick that takes them,
the phase read from the engine's ``TickReport``s. That is the best case for a metronome (a
frame arriving just after a tick would wait a whole period), so latency measures the engine.
A round's frames are submitted together, so one tick takes them all. ``run_workload(load=...)``
varies what each session sends frame by frame (``FrameLoad``: speech, silence, long answers).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

import anyio
import torch

from metronome_engine import KVPolicy, ModelConfig
from metronome_engine.model import LlamaModel
from metronome_sdk import (
    AdmissionRejected,
    Engine,
    EngineClosed,
    EngineError,
    EngineStalled,
    InputFrame,
    LoadShed,
    Session,
    SessionClosed,
    TickReport,
)

from .arrivals import SessionPlan, plan_arrivals, plan_sessions
from .silent import is_silence

Policy = Literal["full", "window"]


__all__ = [
    "FrameLoad",
    "FrameRecord",
    "SessionPlan",
    "SessionRecord",
    "StreamExperiment",
    "StreamSpec",
    "WorkloadTrace",
    "bench_model",
    "plan_arrivals",
    "plan_sessions",
    "run_workload",
    "small_model",
]

Outcome = Literal["ok", "empty", "stalled", "error", "dropped", "unanswered", "shed"]


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamSpec:
    """How sessions stream: ``tokens_per_frame`` tokens every ``period`` seconds.

    ``drop_late``: a real-time client that still waits for its previous frame's output
    when the next frame is due drops the new one (audio that late is useless) rather
    than queueing it behind; the dropped frame counts as never answered.
    """

    period: float
    tokens_per_frame: int
    lead: float
    drop_late: bool = True
    first_token: int = 32

    def frame(self) -> InputFrame:
        return InputFrame.from_tokens(list(range(self.first_token, self.first_token + self.tokens_per_frame)))

    @property
    def tokens_per_tick(self) -> int:
        """Tokens a streaming session appends each tick: its frame plus its fed-back output token."""
        return self.tokens_per_frame + 1


@dataclass(frozen=True, slots=True)
class FrameLoad:
    """What one session sends one tick: ``tokens`` input tokens (0: an empty frame, the model talks on),
    and how many tokens the frame's output carries (``decode``: the session's ``decode_tokens``)."""

    tokens: int
    decode: int = 1

    def __post_init__(self) -> None:
        if self.tokens < 0 or self.decode < 1:
            raise ValueError(f"a frame carries tokens >= 0 and decodes >= 1, got {self.tokens} and {self.decode}")

    def frame(self, first_token: int = 32) -> InputFrame:
        if self.tokens == 0:
            return InputFrame.empty()
        return InputFrame.from_tokens(range(first_token, first_token + self.tokens))


class StreamExperiment:
    """What the experiments' configs share: ``window`` + ``sinks`` over blocks of ``block_size``,
    fed as ``spec`` says. Subclasses are dataclasses with those fields and a ``spec``."""

    __slots__ = ()
    window: int
    sinks: int
    block_size: int

    @property
    def spec(self) -> StreamSpec:
        raise NotImplementedError

    def policy(self, kind: Policy) -> KVPolicy:
        """The KV policy a run is under: unbounded, or the window with its sinks."""
        return KVPolicy.full() if kind == "full" else KVPolicy.windowed(self.window, sinks=self.sinks)

    @property
    def session_bound(self) -> int:
        """Blocks one windowed session holds at most while a tick appends its frame."""
        bound = self.policy("window").max_blocks(self.block_size, chunk=self.spec.tokens_per_tick)
        assert bound is not None  # a window policy is always bounded
        return bound


@dataclass(slots=True)
class FrameRecord:
    session: int
    index: int
    sent: float  # clock time the frame was due (sent, or dropped)
    outcome: Outcome = "unanswered"
    latency: float | None = None  # the engine's per-frame latency, for frames it answered (empty ones too)


@dataclass(slots=True)
class SessionRecord:
    plan: SessionPlan
    admitted: bool
    opened: float | None = None
    closed: float | None = None
    shed: tuple[float, LoadShed] | None = None  # when the engine shed it, and the typed error it ended with


@dataclass(slots=True)
class WorkloadTrace:
    """Everything a run saw: per-tick reports, per-frame outcomes, per-session admission."""

    start: float
    end: float = 0.0
    ticks: list[TickReport] = field(default_factory=list)
    frames: list[FrameRecord] = field(default_factory=list)
    sessions: list[SessionRecord] = field(default_factory=list)
    limits: list[tuple[float, int, int]] = field(default_factory=list)  # (time, admission cap, sessions open)
    bound_by: list[str | None] = field(default_factory=list)  # stats().limit_bound_by beside each of limits
    errors: list[str] = field(default_factory=list)  # engine errors other than stalls, as reported

    def first_stall(self) -> TickReport | None:
        return next((t for t in self.ticks if t.stalled), None)

    def stalls(self) -> int:
        return sum(len(t.stalled) for t in self.ticks)

    def waited(self, f: FrameRecord) -> float:
        """The frame's latency, or for a frame never answered the time it had waited when the run ended."""
        if f.outcome == "ok" and f.latency is not None:
            return f.latency
        return self.end - f.sent


@dataclass(slots=True, eq=False)
class _Live:
    plan: SessionPlan
    session: Session
    stop_at: float
    frames: list[FrameRecord] = field(default_factory=list)
    answered: int = 0
    done_sending: bool = False


def small_model(seed: int = 0) -> LlamaModel:
    """A random two-layer Llama whose steps cost a millisecond: for pool dynamics, not for words."""
    config = ModelConfig(
        vocab_size=256,
        hidden_size=64,
        intermediate_size=128,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        head_dim=16,
        max_position_embeddings=1 << 20,
    )
    model = LlamaModel(config)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:  # norms keep their ones
                p.copy_(torch.randn(p.shape, generator=gen) * 0.05)
    return model.eval()


def bench_model(name: str) -> LlamaModel:
    """``"small"`` (random, fast) or a real model name/folder (``"smollm2-135m-instruct"``)."""
    if name == "small":
        return small_model()
    from metronome_engine.weights import load_model

    return load_model(name)


class _Phase:
    """The engine's metronome phase, read from its tick reports.

    A report's ``time - step_seconds`` is a tick's start plus the delays around the step
    (the thread hop, a busy event loop), all late: the earliest of recent estimates, taken
    modulo the period, is the phase.
    """

    def __init__(self, ticks: list[TickReport], period: float) -> None:
        self._ticks = ticks
        self._period = period

    def tick_start(self) -> float | None:
        if not self._ticks:
            return None
        p = self._period
        recent = [self._ticks[-1]]
        for t in reversed(self._ticks[-8:-1]):  # only ticks since the engine last went idle
            if recent[-1].time - t.time > 1.5 * p:
                break
            recent.append(t)
        last = recent[0].time - recent[0].step_seconds
        shift = min(((t.time - t.step_seconds - last + p / 2) % p) - p / 2 for t in recent)
        return last + shift


async def run_workload(
    engine: Engine,
    plans: list[SessionPlan],
    spec: StreamSpec,
    trace: WorkloadTrace,
    *,
    horizon: float,
    clock: Callable[[], float] = time.monotonic,
    on_round: Callable[[float], None] | None = None,
    load: Callable[[SessionPlan, int], FrameLoad] | None = None,
) -> WorkloadTrace:
    """Stream ``plans`` on ``engine`` until every session has left or ``horizon`` seconds passed.

    ``engine`` must be started and report its ticks into ``trace.ticks`` (``on_tick``).
    Sessions are opened with ``try_session``: one the engine refuses is recorded and
    does not come back. ``on_round`` gets the seconds elapsed after every round.
    ``load(plan, frame_index)`` says what a session sends each frame (default: ``spec.frame()``).
    """
    period = spec.period
    phase = _Phase(trace.ticks, period)
    waiting = sorted(plans, key=lambda p: p.arrival)
    live: list[_Live] = []
    t0 = trace.start
    next_round = t0
    async with anyio.create_task_group() as tg:
        while True:
            await anyio.sleep(max(0.0, next_round - clock()))
            now = clock()
            rel = now - t0
            if rel >= horizon:
                break
            for s in live:
                if not s.done_sending and now >= s.stop_at:
                    s.done_sending = True
                    if s.answered == len(s.frames):
                        tg.start_soon(_close, s, trace, clock)
            while waiting and waiting[0].arrival <= rel:
                plan = waiting.pop(0)
                record = SessionRecord(plan, admitted=False)
                trace.sessions.append(record)
                try:
                    session = engine.try_session()
                except AdmissionRejected:
                    continue
                record.admitted, record.opened = True, now
                entry = _Live(plan, session, stop_at=now + plan.duration)
                live.append(entry)
                tg.start_soon(_read, entry, trace, record, clock)
            live = [s for s in live if not s.session.closed]
            if not waiting and not live:
                break
            senders: list[tuple[Session, InputFrame]] = []
            for s in live:
                if s.done_sending:
                    continue
                frame = FrameRecord(s.plan.index, len(s.frames), now)
                s.frames.append(frame)
                trace.frames.append(frame)
                if spec.drop_late and s.answered < len(s.frames) - 1:
                    frame.outcome = "dropped"
                    s.answered += 1  # nothing will come back for it
                    continue
                if load is None:
                    senders.append((s.session, spec.frame()))
                else:
                    what = load(s.plan, frame.index)
                    s.session.decode_tokens = what.decode
                    senders.append((s.session, what.frame(spec.first_token)))
            await _send_together(senders)
            stats = engine.stats()
            trace.limits.append((now, stats.limit, stats.sessions))
            trace.bound_by.append(stats.limit_bound_by)
            if on_round is not None:
                on_round(rel)
            next_round = _next_round(next_round + period, phase.tick_start(), period, spec.lead)
        tg.cancel_scope.cancel()
    trace.end = clock()
    for s in live:
        if not s.session.closed:
            await s.session.aclose()
    for record in trace.sessions:
        if record.admitted and record.closed is None:
            record.closed = trace.end
    return trace


async def _send_together(sends: list[tuple[Session, InputFrame]]) -> None:
    """Submit one frame per session before the engine's tick loop runs again.

    An engine whose next tick is overdue ticks at the first frame it sees; sends awaited one
    after another would each yield to it, and the round would split over two ticks. Sends
    started together in one task group all submit in one pass of the event loop.
    """
    async with anyio.create_task_group() as tg:
        for session, frame in sends:
            tg.start_soon(_send, session, frame)


async def _send(session: Session, frame: InputFrame) -> None:
    # closed (or shed) since the round's check: its reader records the rest
    with contextlib.suppress(SessionClosed, EngineClosed, LoadShed):
        await session.send(frame)


def _next_round(due: float, tick_start: float | None, period: float, lead: float) -> float:
    """``due``, moved by less than half a period to ``lead`` seconds before one of the engine's ticks."""
    if tick_start is None:
        return due - lead
    k = round((due + lead - tick_start) / period)
    return tick_start + k * period - lead


async def _read(s: _Live, trace: WorkloadTrace, record: SessionRecord, clock: Callable[[], float]) -> None:
    try:
        while True:
            if s.done_sending and s.answered >= len(s.frames):
                break
            try:
                out = await s.session.receive()
            except EngineClosed:
                raise
            except LoadShed as exc:  # ended by the engine, typed: what it had not answered counts as shed
                record.closed, s.done_sending = clock(), True
                record.shed = (record.closed, exc)
                for f in (f for f in s.frames if f.outcome == "unanswered"):
                    f.outcome = "shed"
                break
            except EngineError as exc:
                frame = _next_unanswered(s)
                if frame is not None:
                    frame.outcome = "stalled" if isinstance(exc, EngineStalled) else "error"
                if not isinstance(exc, EngineStalled):
                    trace.errors.append(f"{exc!r} caused by {exc.__cause__!r}")
                continue
            frame = _next_unanswered(s)
            if frame is not None:
                frame.outcome = "empty" if is_silence(out) else "ok"
                frame.latency = out.latency
    except (SessionClosed, EngineClosed):
        return
    await _close(s, trace, clock, record)


def _next_unanswered(s: _Live) -> FrameRecord | None:
    for f in s.frames:
        if f.outcome == "unanswered":
            s.answered += 1
            return f
    return None


async def _close(
    s: _Live, trace: WorkloadTrace, clock: Callable[[], float], record: SessionRecord | None = None
) -> None:
    if s.session.closed:
        return
    await s.session.aclose()
    if record is None:
        record = next(r for r in trace.sessions if r.plan is s.plan)
    record.closed = clock()
