"""The state the engine's parts share: each admitted session's state, the core, the pool.

A ``SessionState`` is the engine's record of one admitted session: its sequence in the core,
its KV numbers, and the context queued ahead of its frames. The session's queues live in its
``SessionChannel``; this is the engine-side half, which only the engine, its tick loop and its
delivery write.

Context queued for a session (a system prompt, a turn given with ``Session.append``) waits in
two places: ``context_ahead``, appended by the tick loop in ticks of its own before the
session's next frame, and ``with_next_frame``, which goes into that frame's chunk (the
context's last token at least, so that an empty frame has a token to go on from).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from metronome_engine import EngineBackend, PoolStats, SamplingParams

from .channel import SessionChannel
from .memory import ConversationMemory
from .worker import CoreThread

__all__: list[str] = []  # internal: SessionState, EngineState


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

    @property
    def pinned(self) -> int:
        """Tokens of the system prompt the engine keeps pinned (0: none)."""
        return self.memory.pinned if self.memory is not None else 0


@dataclass(slots=True, eq=False)
class EngineState:
    """What the engine, its tick loop and its delivery all read: one object, not each other's privates."""

    core: EngineBackend
    worker: CoreThread
    pool: PoolStats
    session_blocks: int | None  # a session's bound in blocks; None: unbounded (kv="full")
    sessions: dict[int, SessionState] = field(default_factory=dict)  # the admitted sessions, by session id
    closed: bool = False
