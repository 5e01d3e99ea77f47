"""A session's one owner on the engine side: the ``SessionLink`` that admission returns.

``Session`` validates what the application gives it and keeps every await cancel-safe; all
it does to the engine goes through its link: queue a frame, give a turn ahead, withdraw a
frame or its output, interrupt the reply, release the session. The link writes the session's
engine-side state (``state.SessionState``, whose methods keep the rules for the context and
the last reply token); the tick loop and delivery write the rest of it as the steps go.

``SessionHost`` is what a session needs of its engine: admission, which hands out links, and
the few things a session's users read (``stats()``, ``timing``, ``next_tick``). ``Engine``
is the one host; a bare ``Session()`` makes one (the class declared ``embedded=True``).
"""

from __future__ import annotations

import abc
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any, ClassVar, TypeVar

import anyio

from metronome_engine import EngineBackend, SamplingParams

from .._codec import TextTokenizer
from .._config import ReliabilityConfig, TimingConfig
from .._exceptions import RewindUnavailable, TurnInterrupted
from .._frames import InputFrame
from .._stats import EngineStats, SessionStats
from .channel import ChannelState, SessionChannel
from .encoding import InputEncoder
from .state import ContextSnapshot, SessionState

__all__: list[str] = []  # internal: SessionHost, SessionRequest, SessionLink, LinkServices, ContextMark

T = TypeVar("T")

# seconds a rewind waits on one tick's end before it looks again: an engine closing runs no more ticks
_TICK_WAIT = 0.1


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionRequest:
    """What a session asks admission for."""

    session_id: int
    system_prompt: str | None
    sampling: SamplingParams | None
    log: Any  # the session's bound logger
    pin_system_prompt: bool = True
    decode_tokens: int = 1
    rewind_tokens: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class LinkServices:
    """What every link of one engine reaches on the engine side."""

    encoder: InputEncoder
    tokenizer: TextTokenizer | None
    clock: Callable[[], float]
    retry_after: float  # what InputQueueFull suggests: a period
    wake: Callable[[], None]  # the tick loop has work: wake it, start it if it rests
    input_refused: Callable[[], None]  # count a frame refused at a full input queue
    release: Callable[[SessionState], Awaitable[None]]  # out of the admitted set, its blocks freed
    # fn(core) on the core thread, once the session is in no tick: holds and rewinds its sequence
    on_core: Callable[[SessionState, Callable[[EngineBackend], Any]], Awaitable[Any]]
    tick_finished: Callable[[], Awaitable[None]]  # returns when the tick in flight is delivered (or abandoned)


@dataclass(frozen=True, slots=True)
class ContextMark:
    """A point in a session's context that ``Session.rewind`` goes back to, exactly.

    ``num_tokens``: the session's stream length at the mark; ``limit``: the most tokens the
    session may append after it and still go back (``Session(rewind_tokens=...)``).
    """

    session_id: int
    num_tokens: int
    limit: int
    _snapshot: ContextSnapshot = field(repr=False, compare=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class Interruption:
    """What an interrupt did to the session's context (``Session.interrupt`` reports it)."""

    kept: tuple[int, ...]
    withdrawn: int
    untrimmed: int


class SessionLink:
    """One admitted session's engine side; ``Session`` holds it from open to close."""

    __slots__ = ("_services", "state")

    def __init__(self, state: SessionState, services: LinkServices) -> None:
        self.state = state  # read by the session (its channel, its numbers); written through the methods here
        self._services = services

    @property
    def channel(self) -> SessionChannel:
        return self.state.channel

    @property
    def tokenizer(self) -> TextTokenizer | None:
        return self._services.tokenizer

    def set_decode_tokens(self, value: int) -> None:
        self.state.decode_tokens = value

    @property
    def context_pending(self) -> bool:
        """Whether context given ahead (a prompt, a turn) still waits for ticks to append it."""
        return bool(self.state.context_ahead)

    def submit(self, frame: InputFrame) -> int:
        """Encode ``frame`` and queue it for the next tick (``InputQueueFull`` when the queue is full); its index."""
        services, state = self._services, self.state
        if not state.channel.has_input_room():
            services.input_refused()
        queued = services.encoder.queue(state, frame, submitted=services.clock(), retry_after=services.retry_after)
        services.wake()
        return queued.index

    def append(self, text: str) -> int:
        """Queue ``text`` as a turn ahead of the next frame (``Session.append``); its tokens."""
        tokens = self._services.encoder.turn_ahead(self.state, text)
        self._services.wake()
        return tokens

    def withdraw(self, index: int) -> None:
        """Nobody waits for frame ``index`` any more (a cancelled step): the frame, or its output, goes."""
        state = self.state
        queued = state.channel.withdraw(index)
        if queued is not None:
            state.hand_back(queued)
        state.reply_withdrawn(index)

    def interrupt(self, answer: Callable[[int], TurnInterrupted]) -> Interruption:
        """Stop the current reply at the next tick: every frame not yet answered gets ``answer(index)``."""
        state = self.state
        channel = state.channel
        reply_unread = state.reply_unread()
        # a frame decoding several tokens in the tick now running: its rounds stop here, and those
        # begun have put tokens the reader will never have into the context
        begun = sum(p.rounds.cut() for p in channel.inputs if p.in_tick and p.rounds is not None)
        channel.untrimmed += begun
        answered: list[int] = []

        def counted(index: int) -> TurnInterrupted:
            answered.append(index)
            return answer(index)

        for queued in channel.withdraw_all(counted):
            state.hand_back(queued)
        if reply_unread:
            state.reply_withdrawn()
        kept = tuple(channel.reply)
        untrimmed, channel.untrimmed, channel.reply = channel.untrimmed, 0, []
        return Interruption(kept=kept, withdrawn=len(answered), untrimmed=untrimmed)

    async def mark(self) -> ContextMark:
        """Hold the context as it is now (``Session.mark``); the mark replaces the last one."""
        state = self.state
        if state.rewind_tokens == 0:
            raise ValueError(
                f"session {state.session_id} was opened without rewind_tokens; open it with Session(rewind_tokens=64)"
            )
        if not state.quiet() or state.rewinding:
            raise ValueError(
                f"session {state.session_id} cannot be marked with frames queued, unread, in a tick or a turn "
                "still being appended: read its outputs and await append() first"
            )
        seq_id = state.seq_id
        if seq_id is not None:
            await self._services.on_core(state, lambda core: core.hold(seq_id, state.rewind_tokens))  # type: ignore[attr-defined]
        state.mark = snap = state.snapshot()
        return ContextMark(state.session_id, snap.num_tokens, state.rewind_tokens, snap)

    async def rewind(self, mark: ContextMark, *, still_open: Callable[[], object]) -> None:
        """Take the context back to ``mark`` (``Session.rewind``).

        ``still_open`` raises the session's typed error once it is closed: called after waiting out a
        tick, since the engine may have ended the session meanwhile.
        """
        state = self.state
        since = state.num_tokens - mark.num_tokens
        if mark.session_id != state.session_id or state.mark is not mark._snapshot:
            raise RewindUnavailable(
                f"that mark is not session {state.session_id}'s current mark (each mark replaces the last; "
                "keep() and rewind() end it)",
                session_id=state.session_id,
                tokens_since=since,
            )
        # a frame in the tick now running (one interrupt() withdrew: its output will be dropped) leaves
        # with that tick, and one partly appended with the ticks that append the rest: wait for them
        while state.channel.state is ChannelState.OPEN and any(p.in_tick or p.started for p in state.channel.inputs):
            with anyio.move_on_after(_TICK_WAIT):
                await self._services.tick_finished()
        still_open()  # ended while it waited (the engine closed): nothing to go back to
        since = state.num_tokens - mark.num_tokens
        if state.channel.inputs or state.channel.unread:
            raise ValueError(
                f"session {state.session_id} has frames queued or unread: interrupt() or read them before rewind()"
            )
        if since > mark.limit:
            raise RewindUnavailable(
                f"session {state.session_id} appended {since} tokens since the mark, past its rewind_tokens "
                f"({mark.limit}): the window moved on and the context since the mark stays",
                session_id=state.session_id,
                tokens_since=since,
            )
        state.rewinding = True
        try:
            seq_id = state.seq_id
            blocks = state.num_blocks
            if seq_id is not None and mark.num_tokens == 0:  # marked before its first step: back to no sequence
                await self._services.on_core(state, lambda core: core.free_sequence(seq_id))
                state.seq_id, blocks = None, 0
            elif seq_id is not None and since > 0:
                try:
                    blocks = await self._services.on_core(state, lambda core: core.rewind(seq_id, mark.num_tokens))  # type: ignore[attr-defined]
                except ValueError as exc:  # the hold lapsed in the core (a step that stalled past the limit)
                    raise RewindUnavailable(
                        f"session {state.session_id} cannot go back to its mark: {exc}",
                        session_id=state.session_id,
                        tokens_since=since,
                    ) from exc
            state.restore(mark._snapshot, blocks)
        finally:
            state.rewinding = False
        self._services.wake()  # frames sent while it rewound wait for it

    async def keep(self, mark: ContextMark) -> None:
        """The tokens since ``mark`` stay for good (``Session.keep``): its hold ends."""
        state = self.state
        if state.mark is not mark._snapshot:
            return  # replaced or ended already
        state.mark = None
        seq_id = state.seq_id
        if seq_id is not None:
            await self._services.on_core(state, lambda core: core.release_hold(seq_id))  # type: ignore[attr-defined]

    async def release(self) -> None:
        """The application closed the session: out of the admitted set, its blocks returned before this returns."""
        await self._services.release(self.state)

    def stats(self, *, open: bool) -> SessionStats:
        state = self.state
        counts, memory, channel = state.channel.counts, state.memory, state.channel
        return SessionStats(
            session_id=state.session_id,
            open=open,
            frames=counts.frames,
            deadline_misses=counts.deadline_misses,
            stalls=counts.stalls,
            outputs_dropped=counts.outputs_dropped,
            num_tokens=state.num_tokens,
            num_blocks=state.num_blocks,
            frames_sent=counts.sent,
            queued_inputs=len(channel.inputs),
            unread_outputs=channel.unread,
            pinned_tokens=memory.kept_prefix if memory is not None else 0,
            evicted_tokens=memory.evicted_tokens if memory is not None else 0,
            turns=memory.turns if memory is not None else 0,
            oldest_resident_turn=memory.oldest_resident_turn if memory is not None else None,
            system_prompt_resident=memory.prompt_resident if memory is not None else True,
        )


class SessionHost(abc.ABC):
    """What a session needs of its engine. ``Engine`` is the host (``class Engine(SessionHost, embedded=True)``)."""

    _embedded: ClassVar[type[SessionHost] | None] = None

    def __init_subclass__(cls, *, embedded: bool = False, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if embedded:
            SessionHost._embedded = cls

    @staticmethod
    def embedded() -> SessionHost:
        """A new host with the default configuration: what a bare ``Session()`` opens on."""
        host = SessionHost._embedded
        if host is None:
            raise RuntimeError("no engine class is declared embedded; import metronome_sdk")
        return host()

    reliability: ReliabilityConfig
    timing: TimingConfig

    @property
    @abc.abstractmethod
    def closed(self) -> bool: ...

    @property
    @abc.abstractmethod
    def next_tick(self) -> float | None: ...

    @property
    @abc.abstractmethod
    def tokenizer(self) -> TextTokenizer | None: ...

    @abc.abstractmethod
    def stats(self) -> EngineStats: ...

    @abc.abstractmethod
    async def open_link(self, request: SessionRequest, *, timeout: float | None = None) -> SessionLink:
        """Admit the session, waiting up to ``timeout`` for room; its link, or ``AdmissionRejected``."""

    @abc.abstractmethod
    def open_link_nowait(self, request: SessionRequest) -> SessionLink:
        """Admit the session now, or raise ``AdmissionRejected`` at once."""

    @abc.abstractmethod
    async def __aenter__(self) -> SessionHost: ...

    @abc.abstractmethod
    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None: ...
