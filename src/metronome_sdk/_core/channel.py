"""A session's channel: its bounded input and output queues, the slow-consumer policy, its state.

The session owns it; the engine puts frames in at one end and results out at the other, and
nothing else edits a session's queues. Results are tagged with the input frame's index, so a
caller that stops waiting for one (a cancelled ``step()``, ``interrupt()``) can withdraw it and
no later ``receive()`` ever returns it: a stale frame cannot surface.

States: *open*; *closed* (the application closed it); *ended* (the engine ended it with an
error: shed, broken, engine failed; unread results stay readable, then the error);
*engine closed* (the application closed the engine).
"""

from __future__ import annotations

import enum
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from .._exceptions import DeadlineMissed, MetronomeError
from .._frames import InputFrame, OutputFrame
from .signal import Signal

__all__: list[str] = []  # internal: SessionChannel, QueuedFrame, DecodeRounds, ResultFate, ChannelState


class ChannelState(enum.Enum):
    OPEN = "open"
    CLOSED = "closed"  # by the application
    ENDED = "ended"  # by the engine, with an error
    ENGINE_CLOSED = "engine_closed"  # the application closed the engine


class ResultFate(enum.Enum):
    """What became of a result handed to the channel."""

    DELIVERED = "delivered"
    DROPPED_OLDEST = "dropped_oldest"  # delivered; the oldest unread result was discarded for it
    OVERFLOW = "overflow"  # not delivered: the queue is full and the policy is to shed the session
    DISCARDED = "discarded"  # nobody waits for it (withdrawn, interrupted, or the channel is closed)


class DecodeRounds:
    """The extra decode rounds of a frame in its tick, which ``interrupt()`` can stop between two.

    Each round appends the frame's last decoded token before sampling the next, so a round
    begun puts a token the reader never had into the context. The core thread begins a round
    only while the frame is not cut; ``cut()`` says, exactly, how many it had begun. Both
    sides hold one lock: the core thread and the event loop meet here only.
    """

    __slots__ = ("_begun", "_cut", "_lock")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cut = False
        self._begun = 0

    def begin(self) -> bool:
        """Core thread: may the next round run? (it counts as begun if so)"""
        with self._lock:
            if self._cut:
                return False
            self._begun += 1
            return True

    def undo(self) -> None:
        """Core thread: the round begun appended nothing (the step raised, or the pool was full)."""
        with self._lock:
            self._begun -= 1

    def cut(self) -> int:
        """Event loop: no round begins from now on; the rounds already begun (their tokens stay)."""
        with self._lock:
            self._cut = True
            return self._begun


@dataclass(slots=True, eq=False)
class QueuedFrame:
    """An input frame waiting for the ticks that append it (a long frame takes several)."""

    frame: InputFrame
    tokens: list[int]  # still to append
    submitted: float
    index: int
    carried: int = 0  # leading tokens carried from the session's context (a prompt, a turn): handed back if withdrawn
    first_turn: bool = False  # it rendered the chat template's preamble
    started: bool = False  # some of its tokens were appended: it can no longer be withdrawn
    in_tick: bool = False
    rounds: DecodeRounds | None = None  # in the tick that decodes several of its tokens


@dataclass(slots=True)
class SessionCounts:
    """One session's counts (kept by ``Counters``, read by ``Session.stats()``)."""

    sent: int = 0
    frames: int = 0
    deadline_misses: int = 0
    stalls: int = 0
    outputs_dropped: int = 0


Result = OutputFrame | BaseException


@dataclass(slots=True, eq=False)
class SessionChannel:
    session_id: int
    input_queue: int
    output_queue: int
    drop_oldest: bool
    state: ChannelState = ChannelState.OPEN
    error: MetronomeError | None = None  # why the engine ended it
    counts: SessionCounts = field(default_factory=SessionCounts)
    inputs: deque[QueuedFrame] = field(default_factory=deque)
    _results: deque[tuple[int | None, Result]] = field(default_factory=deque)
    _withdrawn: set[int] = field(default_factory=set)  # in a tick: their results are discarded on arrival
    # unread results' tokens already in the session's context, by frame: a frame decoding several
    # tokens appends all but its last in its own tick, and the last goes in with the next frame
    # (a pipelining sender gets ahead of its reader)
    _in_context: dict[int, int] = field(default_factory=dict)
    untrimmed: int = 0  # reply tokens withdrawn unread though in the context (since the last interrupt)
    reply: list[int] = field(default_factory=list)  # tokens the reader took since the last input frame
    _changed: Signal = field(default_factory=Signal)  # a result arrived, or the state changed
    _room: Signal = field(default_factory=Signal)  # the input queue may have room

    # state ---------------------------------------------------------------------------------------

    @property
    def open(self) -> bool:
        return self.state is ChannelState.OPEN

    def close(self, state: ChannelState = ChannelState.CLOSED) -> None:
        """The application (or its engine's closing) closed the channel: inputs and unread results go."""
        if self.state is not ChannelState.OPEN:
            return
        self.state = state
        self.inputs.clear()
        self._results.clear()
        self._notify()

    def end(self, error: MetronomeError) -> None:
        """The engine ended the session: unread results stay, then ``error``; inputs are dropped."""
        if self.state is not ChannelState.OPEN:
            return
        self.state = ChannelState.ENDED
        self.error = error
        self.inputs.clear()
        self._results.append((None, error))
        self._notify()

    # the engine's end ----------------------------------------------------------------------------

    def has_input_room(self) -> bool:
        return len(self.inputs) < self.input_queue

    def put_input(self, pending: QueuedFrame) -> None:
        self.inputs.append(pending)
        self.counts.sent += 1
        if pending.frame.kind != "empty":
            self.reply = []  # new input: the next outputs are a new reply

    def context_appended(self) -> None:
        """A tick appended some of the context queued ahead of the frames (``Session.append``)."""
        self._changed.fire()

    def feedback_appended(self, index: int) -> None:
        """Frame ``index``'s output token goes into the context with this tick's chunk."""
        if self.is_unread(index):
            self._in_context[index] = self._in_context.get(index, 0) + 1

    def put(self, index: int | None, item: Result) -> ResultFate:
        """Hand a result to the reader within the bounded output queue."""
        if self.state is not ChannelState.OPEN or (index is not None and self._withdrawn_now(index)):
            return ResultFate.DISCARDED
        if len(self._results) < self.output_queue:
            self._append(index, item)
            return ResultFate.DELIVERED
        if not self.drop_oldest:
            return ResultFate.OVERFLOW
        tag, _ = self._results.popleft()
        if tag is not None:
            self._count_untrimmed(tag)
        self._append(index, item)
        return ResultFate.DROPPED_OLDEST

    def withdrawn(self, index: int) -> bool:
        """Whether nobody waits for frame ``index`` any more (its result will be discarded)."""
        return index in self._withdrawn

    def _withdrawn_now(self, index: int) -> bool:
        if index in self._withdrawn:
            self._withdrawn.discard(index)
            return True
        return False

    def _append(self, index: int | None, item: Result) -> None:
        self._results.append((index, item))
        tokens = _output_tokens(item)
        if index is not None and len(tokens) > 1:
            self._in_context[index] = len(tokens) - 1
        self._notify()

    # the reader's end ----------------------------------------------------------------------------

    @property
    def unread(self) -> int:
        return len(self._results)

    def take_nowait(self, index: int | None = None) -> Result | None:
        """The next result (or frame ``index``'s, or a session-level error), or ``None`` if none is here."""
        for i, (tag, item) in enumerate(self._results):
            if index is None or tag == index or tag is None:
                del self._results[i]
                if tag is not None:
                    self._in_context.pop(tag, None)
                self.reply.extend(_output_tokens(item))
                return item
        return None

    async def changed(self) -> None:
        """Wait until a result arrives or the state changes."""
        await self._changed.wait()

    async def input_room(self) -> None:
        """Wait until the input queue may have room (a tick took a frame) or the state changes."""
        await self._room.wait()

    def input_taken(self) -> None:
        self._room.fire()

    def is_unread(self, index: int) -> bool:
        return any(tag == index for tag, _ in self._results)

    def withdraw(self, index: int) -> QueuedFrame | None:
        """Nobody waits for frame ``index`` any more; the frame itself if it left no trace (never appended)."""
        for i, (tag, _) in enumerate(self._results):
            if tag == index:
                del self._results[i]
                self._count_untrimmed(index)
                return None  # its tokens were appended, its result arrived: the result goes
        for i, p in enumerate(self.inputs):
            if p.index == index:
                if p.started or p.in_tick:
                    self._withdrawn.add(index)
                    return None
                del self.inputs[i]
                self._room.fire()
                return p
        return None  # already taken by the reader, or never sent

    def withdraw_all(self, answer: Callable[[int], BaseException]) -> list[QueuedFrame]:
        """Every frame not yet answered is answered with ``answer(index)`` instead, in order.

        Unread results go; queued frames come back (returned, never appended); frames in a
        tick stay, their results to be discarded on arrival.
        """
        indices = [tag for tag, _ in self._results if tag is not None]
        for index in indices:
            self._count_untrimmed(index)
        self._results = deque((tag, item) for tag, item in self._results if tag is None)
        kept: deque[QueuedFrame] = deque()
        gone: list[QueuedFrame] = []
        for p in self.inputs:
            if p.index not in self._withdrawn:  # nobody waits for one withdrawn before
                indices.append(p.index)
            if p.started or p.in_tick:
                self._withdrawn.add(p.index)
                kept.append(p)
            else:
                gone.append(p)
        self.inputs = kept
        for index in sorted(indices):
            self._results.append((index, answer(index)))
        self._notify()
        return gone

    def _count_untrimmed(self, index: int) -> None:
        self.untrimmed += self._in_context.pop(index, 0)

    def _notify(self) -> None:
        self._changed.fire()
        self._room.fire()


def _output_tokens(item: Result) -> tuple[int, ...]:
    output = item.output if isinstance(item, DeadlineMissed) else item
    return output.tokens if isinstance(output, OutputFrame) else ()
