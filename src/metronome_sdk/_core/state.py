"""The state the engine's parts share: each admitted session's state, the core, the pool.

A ``SessionState`` is the engine's record of one admitted session: its sequence in the core,
its KV numbers, and the context queued ahead of its frames. The session's queues live in its
``SessionChannel``; this is the engine-side half, which only the engine, its tick loop and its
delivery write, and only through its methods for the context and the last reply token: the
rules for those (what the model sees, what a withdrawn frame hands back) live here, once.

Context queued for a session (a system prompt, a turn given with ``Session.append``) waits in
two places: ``context_ahead``, appended by the tick loop in ticks of its own before the
session's next frame, and ``with_next_frame``, which goes into that frame's chunk (the
context's last token at least, so that an empty frame has a token to go on from).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from metronome_engine import EngineBackend, PoolStats, SamplingParams

from .channel import QueuedFrame, SessionChannel
from .memory import ConversationMemory
from .worker import CoreThread

__all__: list[str] = []  # internal: SessionState, EngineState


@dataclass(frozen=True, slots=True)
class ContextSnapshot:
    """Everything the engine side knows of a session's context at a mark (``SessionState.snapshot``)."""

    num_tokens: int
    feedback: tuple[int, int] | None
    with_next_frame: tuple[int, ...]
    rendered: bool
    memory: tuple[int, int, int] | None
    reply: tuple[int, ...]
    untrimmed: int


@dataclass(slots=True, eq=False)
class SessionState:
    session_id: int
    channel: SessionChannel
    sampling: SamplingParams | None
    log: Any  # the session's bound logger
    with_next_frame: list[int] = field(default_factory=list)  # context that goes in with the next frame
    context_ahead: list[int] = field(default_factory=list)  # context appended before it, in ticks of its own
    rendered: bool = False  # the chat template's preamble was sent
    memory: ConversationMemory | None = None  # what its model still sees (docs/sessions.md)
    pinned_blocks: int = 0  # blocks the pinned prompt adds to the session's bound (the memory guard counts them)
    seq_id: int | None = None  # the core's sequence, opened by the first tick
    num_tokens: int = 0
    num_blocks: int = 0
    # the last output token and its frame's index: appended with the next chunk (the model sees its own reply)
    feedback: tuple[int, int] | None = None
    decode_tokens: int = 1  # most tokens a frame's output carries (Session.decode_tokens)
    waited: int = 0  # ticks in a row its frame waited on the tick's token budget
    in_tick: bool = False
    ended: bool = False  # out of the engine's admitted set (closed by either side)
    rewind_tokens: int = 0  # most tentative tokens a mark holds (Session(rewind_tokens=...)); 0: no marks
    hold_blocks: int = 0  # blocks a hold adds to the session's bound (the memory guard counts them)
    mark: ContextSnapshot | None = None  # the session's current mark: what rewind() goes back to
    rewinding: bool = False  # a rewind is under way: no tick takes its frames until it is done

    @property
    def pinned(self) -> int:
        """Tokens of the system prompt the engine keeps pinned (0: none)."""
        return self.memory.pinned if self.memory is not None else 0

    # the model sees its own last reply token ----------------------------------------------------
    # A frame's last output token is not in the context when it is sampled: it goes in with the
    # session's next chunk, and only if its output was delivered (the context keeps what the
    # reader could have). Every write of ``feedback`` is one of these methods.

    def reply_head(self) -> list[int]:
        """What goes in before the next chunk: the last reply token, if it is owed."""
        return [self.feedback[0]] if self.feedback is not None else []

    def reply_in_chunk(self) -> None:
        """This tick's chunk carries the last reply token (the channel counts it as in the context)."""
        if self.feedback is not None:
            self.channel.feedback_appended(self.feedback[1])

    def reply_appended(self) -> None:
        """A step appended the session's chunk, and with it the token owed (if any)."""
        self.feedback = None

    def reply_delivered(self, token: int, index: int) -> None:
        """Frame ``index``'s output, ending in ``token``, reached the reader: the model sees it next."""
        self.feedback = (token, index)

    def reply_unread(self) -> bool:
        """Whether the token owed belongs to an output the reader has not taken."""
        return self.feedback is not None and self.channel.is_unread(self.feedback[1])

    def reply_withdrawn(self, index: int | None = None) -> None:
        """The output owed (frame ``index``'s, or any) was never delivered: the model does not see it either."""
        if self.feedback is not None and (index is None or self.feedback[1] == index):
            self.feedback = None

    # going back to a mark (Session.mark / rewind) -----------------------------------------------

    def quiet(self) -> bool:
        """Nothing queued, in a tick, unread or waiting to be appended: the context is what is appended."""
        return not (self.channel.inputs or self.context_ahead or self.in_tick or self.channel.unread)

    def snapshot(self) -> ContextSnapshot:
        """The context as it is now (call when ``quiet()``): what ``restore`` goes back to."""
        return ContextSnapshot(
            num_tokens=self.num_tokens,
            feedback=self.feedback,
            with_next_frame=tuple(self.with_next_frame),
            rendered=self.rendered,
            memory=self.memory.snapshot() if self.memory is not None else None,
            reply=tuple(self.channel.reply),
            untrimmed=self.channel.untrimmed,
        )

    def restore(self, snap: ContextSnapshot, num_blocks: int) -> None:
        """The core went back to ``snap``'s length (holding ``num_blocks``): so does the rest of the context."""
        self.num_tokens, self.num_blocks = snap.num_tokens, num_blocks
        self.feedback = snap.feedback
        self.with_next_frame, self.context_ahead = list(snap.with_next_frame), []
        self.rendered = snap.rendered
        if self.memory is not None and snap.memory is not None:
            self.memory.restore(snap.memory)
        self.channel.reply, self.channel.untrimmed = list(snap.reply), snap.untrimmed

    # context queued ahead of the frames ---------------------------------------------------------

    def queue_prompt(self, tokens: list[int], *, ahead: bool) -> None:
        """The system prompt: prefilled ahead (all but its last token, ``prompt_at_open``), or with the first frame."""
        if ahead:
            self.context_ahead, self.with_next_frame = tokens[:-1], tokens[-1:]
        else:
            self.with_next_frame = list(tokens)
        self.rendered = True

    def take_with_next_frame(self, *, text: bool) -> list[int]:
        """The context that goes in with the frame being queued now; ``text``: it renders the chat preamble."""
        if text:
            self.rendered = True
        taken, self.with_next_frame = self.with_next_frame, []
        return taken

    def queue_turn(self, tokens: list[int]) -> None:
        """A turn given ahead of the next frame: the last reply token first, then all but the turn's
        last token in ticks of their own; that last token goes with the next frame."""
        head = self.reply_head()
        self.reply_in_chunk()
        self.reply_appended()
        if self.memory is not None:  # the turn begins after the context before it and the fed-back token
            self.memory.turn_started(self.num_tokens + len(self.context_ahead) + len(self.with_next_frame) + len(head))
        context = self.with_next_frame + head + tokens
        self.context_ahead.extend(context[:-1])
        self.with_next_frame = context[-1:]
        self.rendered = True

    def hand_back(self, frame: QueuedFrame) -> None:
        """``frame`` left the queue unappended (a cancelled step, an interrupt): what it carried comes back."""
        if frame.carried:
            self.with_next_frame = frame.tokens[: frame.carried] + self.with_next_frame
        if frame.first_turn:
            self.rendered = False

    def context_appended(self, tokens: int) -> None:
        """A tick appended the first ``tokens`` of the context ahead."""
        del self.context_ahead[:tokens]

    def context_to_first_frame(self) -> None:
        """No room now: the rest of the context goes with the next frame, whose step reports the stall as usual."""
        rest, self.context_ahead = self.context_ahead, []
        inputs = self.channel.inputs
        if inputs and not inputs[0].started:
            inputs[0].tokens[:0] = rest
            inputs[0].carried += len(rest)  # handed back with it if it is withdrawn
        else:
            self.with_next_frame[:0] = rest


@dataclass(slots=True, eq=False)
class EngineState:
    """What the engine, its tick loop and its delivery all read: one object, not each other's privates."""

    core: EngineBackend
    worker: CoreThread
    pool: PoolStats
    session_blocks: int | None  # a session's bound in blocks; None: unbounded (kv="full")
    sessions: dict[int, SessionState] = field(default_factory=dict)  # the admitted sessions, by session id
    closed: bool = False
