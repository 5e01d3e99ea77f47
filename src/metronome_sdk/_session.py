"""A session: one conversation on the metronome.

``async with metronome.Session() as s:`` opens a session on the process's default
embedded engine (one per event loop, created on first use, the model weights shared);
``engine.session(...)`` opens one on an explicit engine. Send one input frame per tick
and receive one output frame for each, in order: ``await s.step(frame)``, or
``await s.send(frame)`` and ``async for out in s``.
"""

from __future__ import annotations

import asyncio
import itertools
import weakref
from collections import deque
from types import TracebackType
from typing import TYPE_CHECKING

import anyio

from metronome_engine import SamplingParams

from ._engine import Engine
from ._exceptions import MetronomeError, SessionClosed
from ._frames import InputFrame, OutputFrame
from ._log import get_logger
from ._memory import ConversationMemory
from ._stats import SessionStats

if TYPE_CHECKING:
    from ._engine import _Pending

__all__ = ["Session", "default_engine"]

_ids = itertools.count(1)
MAX_DECODE_TOKENS = 64  # one frame's decode rounds are steps in one tick: more would never fit a deadline
_defaults: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Engine] = weakref.WeakKeyDictionary()


def default_engine() -> Engine:
    """The embedded engine of the running event loop, made on first use with default settings."""
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        raise RuntimeError("the default engine lives in an asyncio event loop; call this from async code") from None
    engine = _defaults.get(loop)
    if engine is None or engine.closed:
        engine = _defaults[loop] = Engine()
    return engine


FrameLike = InputFrame | str | None


def _as_frame(frame: FrameLike) -> InputFrame:
    if frame is None:
        return InputFrame.empty()
    if isinstance(frame, str):
        return InputFrame.from_text(frame)
    if isinstance(frame, InputFrame):
        return frame
    raise ValueError(
        f"a frame is an InputFrame, a str or None, got {type(frame).__name__}; "
        "wrap audio with InputFrame.from_audio(samples, sample_rate=...)"
    )


class Session:
    """One conversation. Open it with ``async with``; each input frame gets one output frame.

    ``system_prompt`` is prefilled with the first frame and, under a window policy,
    pinned: it stays in the cache beside the sinks however long the conversation runs
    (``pin_system_prompt=False`` lets it slide out with the window; see
    docs/sessions.md). ``stats()`` says what the window has dropped since. ``timeout`` is how long opening
    waits for room before ``AdmissionRejected`` (default: the engine's
    ``AdmissionConfig.queue_timeout``); ``open_nowait()`` refuses at once instead.
    Outputs come back in order; a frame the engine could not serve comes back as an
    error (``EngineStalled``, ``CacheExhausted``), never as an empty frame. Unread
    outputs are bounded (``ReliabilityConfig.output_queue``): read them as they come.
    A session the engine ended (``LoadShed``, ``SessionBroken``, ``EngineStalled`` with
    ``reason="engine_failed"``) hands out its unread outputs, then raises that error.

    ``decode_tokens`` is how many tokens a frame's output may carry: the engine decodes
    up to that many in the frame's tick (extra decode steps within the tick), as the
    tick's token budget allows, and fewer once the model ends its turn. A consumer that
    needs text faster than one token a tick (speech synthesis) sets it; it can change
    between frames (``s.decode_tokens = 4``).
    """

    def __init__(
        self,
        system_prompt: str | None = None,
        *,
        engine: Engine | None = None,
        sampling: SamplingParams | None = None,
        timeout: float | None = None,
        decode_tokens: int = 1,
        pin_system_prompt: bool = True,
    ) -> None:
        if not isinstance(pin_system_prompt, bool):
            raise ValueError(f"pin_system_prompt must be True or False, got {pin_system_prompt!r}")
        if system_prompt is not None and not isinstance(system_prompt, str):
            raise ValueError(f"system_prompt must be a str or None, got {type(system_prompt).__name__}")
        if engine is not None and not isinstance(engine, Engine):
            raise ValueError(f"engine must be a metronome Engine, got {type(engine).__name__}")
        self.id = next(_ids)
        self._engine = engine
        self._system_prompt = system_prompt
        self._pin_system_prompt = pin_system_prompt
        self._memory: ConversationMemory | None = None  # set at admission, when the policy is known
        self._pinned_blocks = 0  # blocks the pinned prompt adds to the session's bound (the memory guard counts them)
        self._sampling = sampling
        self._timeout = timeout
        self.decode_tokens = decode_tokens
        self._log = get_logger(session_id=self.id)
        self._opened = False
        self._closed = False
        self._by_engine = False
        self._ended: MetronomeError | None = None  # why the engine ended the session
        self._rendered = False  # the chat template's preamble was sent
        self._seq_id: int | None = None
        self._in_tick = False
        self._prefix: list[int] = []
        self._queue: deque[_Pending] = deque()
        self._feedback: int | None = None  # the last output token, appended with the next chunk
        self._outputs: deque[OutputFrame | BaseException] = deque()
        self._ready: anyio.Event | None = None
        self._frames_sent = 0
        self._frames_out = 0
        self._misses = 0
        self._stalls = 0
        self._dropped = 0  # outputs discarded unread (slow_consumer="drop_oldest")
        self._num_tokens = 0
        self._num_blocks = 0

    @property
    def decode_tokens(self) -> int:
        """Most tokens one frame's output carries (decoded within its tick, as the budget allows)."""
        return self._decode_tokens

    @decode_tokens.setter
    def decode_tokens(self, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_DECODE_TOKENS:
            raise ValueError(
                f"decode_tokens must be an int in [1, {MAX_DECODE_TOKENS}], got {value!r}; "
                "1 decodes one token a tick, 4 suits a speech consumer"
            )
        self._decode_tokens = value

    # opening and closing -------------------------------------------------------------------------

    @property
    def engine(self) -> Engine | None:
        return self._engine

    @property
    def closed(self) -> bool:
        return self._closed

    async def open(self) -> Session:
        """Wait (up to ``timeout``) for admission; raise ``AdmissionRejected`` if no room came."""
        if self._opened:
            self._check_open()
            return self
        engine = self._engine if self._engine is not None else default_engine()
        self._engine = engine
        await engine._open(self, self._timeout)
        return self

    def open_nowait(self) -> Session:
        """Open now or raise ``AdmissionRejected`` at once: the nowait twin of ``open()``."""
        if self._opened:
            self._check_open()
            return self
        engine = self._engine if self._engine is not None else default_engine()
        self._engine = engine
        engine._open_nowait(self)
        return self

    def _attach(self, engine: Engine, prefix: list[int], memory: ConversationMemory, pinned_blocks: int) -> None:
        self._engine = engine
        self._prefix = prefix
        self._memory = memory
        self._pinned_blocks = pinned_blocks
        self._opened = True
        self._ready = anyio.Event()

    @property
    def _pinned(self) -> int:
        """Tokens of the system prompt the engine keeps pinned (0: none)."""
        return self._memory.pinned if self._memory is not None else 0

    async def __aenter__(self) -> Session:
        return await self.open()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the session and return its KV blocks to the pool. Idempotent; safe when cancelled."""
        if self._closed or not self._opened:
            self._closed = True
            return
        self._closed = True
        self._queue.clear()
        self._wake_receivers()
        engine = self._engine
        assert engine is not None
        with anyio.CancelScope(shield=True):
            await engine._close_session(self)
        self._log.info(
            "session.closed",
            by="application",
            frames=self._frames_out,
            stalls=self._stalls,
            deadline_misses=self._misses,
        )

    def _closed_by_engine(self) -> None:
        self._closed = True
        self._by_engine = True
        self._queue.clear()
        self._wake_receivers()
        self._log.info(
            "session.closed", by="engine", frames=self._frames_out, stalls=self._stalls, deadline_misses=self._misses
        )

    def _end(self, error: MetronomeError) -> None:
        """The engine ended the session: unread outputs stay, then ``error``, raised again on later use."""
        if self._closed:
            return
        self._closed = True
        self._by_engine = True
        self._ended = error
        self._queue.clear()
        self._outputs.append(error)
        self._wake_receivers()
        self._log.warning("session.closed", by="engine", error=type(error).__name__, frames=self._frames_out)

    def _check_open(self) -> None:
        if self._ended is not None:
            raise self._ended
        if not self._opened:
            raise SessionClosed(
                f"session {self.id} is not open; use `async with` or await open() first", session_id=self.id
            )
        if self._closed:
            who = "its engine was closed" if self._by_engine else "it was closed"
            raise SessionClosed(f"session {self.id} cannot be used: {who}", session_id=self.id)

    # frames --------------------------------------------------------------------------------------

    async def send(self, frame: FrameLike = None) -> None:
        """Queue one input frame for the next tick (text, ``InputFrame``, or ``None`` for an empty tick)."""
        self._check_open()
        engine = self._engine
        assert engine is not None
        engine._submit(self, _as_frame(frame))
        await anyio.lowlevel.checkpoint()

    async def receive(self) -> OutputFrame:
        """The next output frame, in the order the input frames were sent.

        Raises what the engine reported for that frame (``EngineStalled``,
        ``CacheExhausted``, ``DeadlineMissed`` in strict mode), and ``SessionClosed``
        once the session is closed and every output was taken.
        """
        while True:
            if self._outputs:
                item = self._outputs.popleft()
                if isinstance(item, BaseException):
                    raise item
                return item
            self._check_open()
            assert self._ready is not None
            if self._ready.is_set():
                self._ready = anyio.Event()
            await self._ready.wait()

    async def step(self, frame: FrameLike = None) -> OutputFrame:
        """Send one frame and wait for its output: ``send`` then ``receive``."""
        await self.send(frame)
        return await self.receive()

    async def chat(self, text: str, *, max_tokens: int = 64) -> str:
        """Say ``text`` and collect the reply until the model ends its turn or ``max_tokens``."""
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens must be an int >= 1, got {max_tokens!r}")
        wanted = self._decode_tokens
        try:
            self._decode_tokens = min(wanted, max_tokens)
            out = await self.step(text)
            parts = [out.text]
            produced = len(out.tokens)
            while not out.stop and produced < max_tokens:
                self._decode_tokens = min(wanted, max_tokens - produced)  # never past max_tokens
                out = await self.step()
                parts.append(out.text)
                produced += len(out.tokens)
        finally:
            self._decode_tokens = wanted
        return "".join(parts)

    def __aiter__(self) -> Session:
        return self

    async def __anext__(self) -> OutputFrame:
        try:
            return await self.receive()
        except SessionClosed:
            if self._by_engine or not self._opened:
                raise
            raise StopAsyncIteration from None

    def _deliver(self, item: OutputFrame | BaseException) -> None:
        if self._closed:
            return
        self._outputs.append(item)
        self._wake_receivers()

    def _wake_receivers(self) -> None:
        if self._ready is not None:
            self._ready.set()

    # observability -------------------------------------------------------------------------------

    def stats(self) -> SessionStats:
        memory = self._memory
        return SessionStats(
            session_id=self.id,
            open=self._opened and not self._closed,
            frames=self._frames_out,
            deadline_misses=self._misses,
            stalls=self._stalls,
            outputs_dropped=self._dropped,
            num_tokens=self._num_tokens,
            num_blocks=self._num_blocks,
            pinned_tokens=memory.kept_prefix if memory is not None else 0,
            evicted_tokens=memory.evicted_tokens if memory is not None else 0,
            turns=memory.turns if memory is not None else 0,
            oldest_resident_turn=memory.oldest_resident_turn if memory is not None else None,
            system_prompt_resident=memory.prompt_resident if memory is not None else True,
        )

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("open" if self._opened else "new")
        return f"Session(id={self.id}, {state}, frames={self._frames_out})"
