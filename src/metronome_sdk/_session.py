"""A session: one conversation on the metronome.

The documented form is structured: ``async with metronome.Engine() as engine:`` then
``async with engine.session(...) as s:``. ``async with metronome.Session() as s:`` alone is a
convenience: the session makes its own embedded engine (the model weights are shared between
engines) and closes it when it closes. Send one input frame per tick and receive one output
frame for each, in order: ``await s.step(frame)``, or ``await s.send(frame)`` and
``async for out in s``.

Every await is cancel-safe: cancelled, it loses nothing and leaves nothing stale. A cancelled
``step()`` withdraws its frame (never appended, if no tick took it yet) or its output (never
returned by a later ``receive()``); ``interrupt()`` stops the current reply at the next tick.

The session validates what the application gives it and keeps its awaits cancel-safe; what
it does to the engine goes through its one link there (``_core/link.py``), which admission
returns. The session knows its engine only as a ``SessionHost``: ``Engine`` imports this
module (``engine.session()``), never the other way round.

Why this module is past 400 lines: ``Session`` is the whole public face of a conversation
(opening, frames both ways, a turn given ahead with ``append``, ``chat``, ``interrupt``,
``stats``), and each method is a short delegate to its link, most of it its documentation
and its cancel-safety.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from types import TracebackType

import anyio
import anyio.lowlevel

from metronome_engine import SamplingParams

from ._core.channel import ChannelState
from ._core.link import ContextMark, SessionHost, SessionLink, SessionRequest
from ._exceptions import EngineClosed, SessionClosed, TurnInterrupted
from ._frames import InputFrame, OutputFrame
from ._log import get_logger
from ._stats import SessionStats

__all__ = ["ContextMark", "Interrupted", "Session"]

_ids = itertools.count(1)
MAX_DECODE_TOKENS = 64  # one frame's decode rounds are steps in one tick: more would never fit a deadline

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


@dataclass(frozen=True, slots=True, kw_only=True)
class Interrupted:
    """What ``Session.interrupt()`` did.

    ``kept``: the reply's tokens that stay in the session's context, the ones the reader took
    since the last input frame (``text`` decodes them). ``withdrawn``: frames whose output
    will not come (each answered with ``TurnInterrupted``). ``trimmed``: the context holds
    exactly what was delivered; ``False`` when ``untrimmed`` reply tokens had already been
    appended before the reader took them (a sender running ahead of its reader), which the
    engine cannot take back out of the KV cache.
    """

    kept: tuple[int, ...]
    text: str
    withdrawn: int
    trimmed: bool
    untrimmed: int


class Session:
    """One conversation. Open it with ``async with``; each input frame gets one output frame.

    ``system_prompt`` is prefilled with the first frame. ``timeout`` is how long opening
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

    ``rewind_tokens`` lets the session take tentative tokens back exactly: ``await s.mark()``,
    then up to that many tokens appended (a turn that may not be the caller's last word, the
    start of its answer), then ``await s.rewind(mark)`` (back to the mark, as if they had never
    been) or ``await s.keep(mark)`` (they stay). While a mark holds, the session's window keeps
    what it saw at the mark, so its bound grows by that many tokens' blocks (the memory guard
    counts them); 0, the default, takes no marks.
    """

    def __init__(
        self,
        system_prompt: str | None = None,
        *,
        engine: SessionHost | None = None,
        sampling: SamplingParams | None = None,
        timeout: float | None = None,
        decode_tokens: int = 1,
        pin_system_prompt: bool = True,
        rewind_tokens: int = 0,
    ) -> None:
        if isinstance(rewind_tokens, bool) or not isinstance(rewind_tokens, int) or not 0 <= rewind_tokens <= 4096:
            raise ValueError(f"rewind_tokens must be an int in [0, 4096], got {rewind_tokens!r}; try 64 (0: no marks)")
        if not isinstance(pin_system_prompt, bool):
            raise ValueError(f"pin_system_prompt must be True or False, got {pin_system_prompt!r}")
        if system_prompt is not None and not isinstance(system_prompt, str):
            raise ValueError(f"system_prompt must be a str or None, got {type(system_prompt).__name__}")
        if engine is not None and not isinstance(engine, SessionHost):
            raise ValueError(f"engine must be a metronome Engine, got {type(engine).__name__}")
        self.id = next(_ids)
        self._engine = engine
        self._own_engine = engine is None  # made by open(), closed by aclose()
        self._system_prompt = system_prompt
        self._sampling = sampling
        self._timeout = timeout
        self._pin_system_prompt = pin_system_prompt
        self.rewind_tokens = rewind_tokens
        self._log = get_logger(session_id=self.id)
        self._link: SessionLink | None = None
        self._closed = False
        self.decode_tokens = decode_tokens

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
        if self._link is not None:
            self._link.set_decode_tokens(value)

    # opening and closing -------------------------------------------------------------------------

    @property
    def engine(self) -> SessionHost | None:
        return self._engine

    @property
    def closed(self) -> bool:
        return self._closed or (self._link is not None and not self._link.channel.open)

    def _request(self) -> SessionRequest:
        return SessionRequest(
            session_id=self.id,
            system_prompt=self._system_prompt,
            sampling=self._sampling,
            log=self._log,
            pin_system_prompt=self._pin_system_prompt,
            decode_tokens=self._decode_tokens,
            rewind_tokens=self.rewind_tokens,
        )

    async def open(self) -> Session:
        """Wait (up to ``timeout``) for admission; raise ``AdmissionRejected`` if no room came."""
        if self._link is not None:
            self._check_open()
            return self
        if self._closed:
            raise SessionClosed(f"session {self.id} was closed; open a new session", session_id=self.id)
        engine = self._engine
        if engine is None:
            engine = self._engine = SessionHost.embedded()
        if self._own_engine:
            await engine.__aenter__()
        try:
            self._link = await engine.open_link(self._request(), timeout=self._timeout)
        except BaseException:
            if self._own_engine:  # its task group exits in the scope that entered it (aclose() is shielded)
                await engine.__aexit__(None, None, None)
            raise
        return self

    def open_nowait(self) -> Session:
        """Open now or raise ``AdmissionRejected`` at once: the nowait twin of ``open()``."""
        if self._link is not None:
            self._check_open()
            return self
        if self._engine is None or self._own_engine:
            raise RuntimeError("open_nowait() needs a started engine: use engine.try_session(), or `async with`")
        self._link = self._engine.open_link_nowait(self._request())
        return self

    async def __aenter__(self) -> Session:
        return await self.open()

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the session and return its KV blocks to the pool. Idempotent; safe when cancelled."""
        if self._closed:
            return
        self._closed = True
        link, engine = self._link, self._engine
        with anyio.CancelScope(shield=True):
            if link is not None:
                by_app = link.channel.open
                link.channel.close()
                await link.release()
                if by_app:
                    counts = link.channel.counts
                    self._log.info(
                        "session.closed",
                        by="application",
                        frames=counts.frames,
                        stalls=counts.stalls,
                        deadline_misses=counts.deadline_misses,
                    )
        if self._own_engine and engine is not None:
            # outside the shield: a task group exits in the cancel scope that entered it (its close is shielded)
            await engine.__aexit__(None, None, None)

    def _require_link(self) -> SessionLink:
        if self._link is None:
            raise SessionClosed(
                f"session {self.id} is not open; use `async with` or await open() first", session_id=self.id
            )
        return self._link

    def _check_open(self) -> SessionLink:
        link = self._require_link()
        channel = link.channel
        if channel.error is not None:
            raise channel.error
        if channel.state is ChannelState.ENGINE_CLOSED:
            raise EngineClosed(f"session {self.id} cannot be used: its engine was closed", session_id=self.id)
        if self._closed or channel.state is not ChannelState.OPEN:
            raise SessionClosed(f"session {self.id} cannot be used: it was closed", session_id=self.id)
        return link

    # frames --------------------------------------------------------------------------------------

    def send_nowait(self, frame: FrameLike = None) -> int:
        """Queue one input frame for the next tick, or raise ``InputQueueFull`` at once; its index.

        ``frame``: text, an ``InputFrame``, or ``None`` for an empty tick (the model keeps talking).
        """
        return self._check_open().submit(_as_frame(frame))

    async def send(self, frame: FrameLike = None) -> int:
        """Queue one input frame, waiting while the input queue is full; the frame's index."""
        as_frame = _as_frame(frame)
        await anyio.lowlevel.checkpoint_if_cancelled()
        while True:
            link = self._check_open()
            if link.channel.has_input_room():
                index = self.send_nowait(as_frame)
                await anyio.lowlevel.cancel_shielded_checkpoint()  # queued: a cancel now must not hide that
                return index
            await link.channel.input_room()

    def append_nowait(self, text: str) -> int:
        """Give the user's turn ``text`` ahead of the frame that answers it; the turn's tokens.

        The engine appends the turn over the next ticks (as it prefills a system prompt,
        ``TimingConfig.prompt_at_open``), with no output: within the tick's token budget and
        period beside sessions that may send a frame, as fast as it can while every session has
        such context (no frame can wait on the beat then). The next
        frame then carries only the turn's last token and its own input, so an empty frame
        (``step()``) answers the turn in one short step instead of one step as long as the turn.
        ``ValueError`` while frames are queued (the turn goes in before the next frame), or for
        empty text.
        """
        if not isinstance(text, str):
            raise ValueError(f"append() takes the turn's text as a str, got {type(text).__name__}")
        return self._check_open().append(text)

    async def append(self, text: str) -> int:
        """``append_nowait``, then wait until the engine has appended the turn (all but its last
        token, which goes with the next frame). Cancelled while waiting, the turn still goes in."""
        tokens = self.append_nowait(text)
        link = self._require_link()
        while link.context_pending:
            self._check_open()
            await link.channel.changed()
        await anyio.lowlevel.checkpoint()
        return tokens

    def receive_nowait(self) -> OutputFrame | None:
        """The next output frame if one is here, else ``None``; raises as ``receive()`` does."""
        item = self._require_link().channel.take_nowait()
        if item is None:
            self._check_open()
            return None
        if isinstance(item, BaseException):
            raise item
        return item

    async def receive(self) -> OutputFrame:
        """The next output frame, in the order the input frames were sent.

        Raises what the engine reported for that frame (``EngineStalled``,
        ``CacheExhausted``, ``DeadlineMissed`` in strict mode, ``TurnInterrupted``),
        ``SessionClosed`` once the session is closed, and ``EngineClosed`` once its engine is.
        """
        await anyio.lowlevel.checkpoint_if_cancelled()
        while True:
            item = self.receive_nowait()
            if item is not None:
                await anyio.lowlevel.cancel_shielded_checkpoint()
                return item
            await self._require_link().channel.changed()

    async def step(self, frame: FrameLike = None) -> OutputFrame:
        """Send one frame and wait for its output.

        Cancel-safe: cancelled before a tick took the frame, it is withdrawn (never appended);
        cancelled later, its output is discarded when it comes, and no ``receive()`` returns it.
        """
        index = await self.send(frame)
        link = self._require_link()
        channel = link.channel
        try:
            while True:
                item = channel.take_nowait(index)
                if item is not None:
                    break
                self._check_open()
                await channel.changed()
        except BaseException:
            link.withdraw(index)  # its output is never delivered: the model does not see it either
            raise
        if isinstance(item, BaseException):
            raise item
        return item

    async def chat(self, text: str, *, max_tokens: int = 64) -> str:
        """Say ``text`` and collect the reply until the model ends its turn or ``max_tokens``."""
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens must be an int >= 1, got {max_tokens!r}")
        wanted = self._decode_tokens
        try:
            self.decode_tokens = min(wanted, max_tokens)
            out = await self.step(text)
            parts = [out.text]
            produced = len(out.tokens)
            while not out.stop and produced < max_tokens:
                self.decode_tokens = min(wanted, max_tokens - produced)  # never past max_tokens
                out = await self.step()
                parts.append(out.text)
                produced += len(out.tokens)
        finally:
            self.decode_tokens = wanted
        return "".join(parts)

    def interrupt(self) -> Interrupted:
        """Stop the current reply at the next tick (barge-in); say which of its tokens the context keeps.

        Every frame not yet answered is answered with ``TurnInterrupted`` instead: queued frames
        are withdrawn unappended, unread outputs are dropped, and the output of a frame in the
        tick now running is discarded when it comes. The session stays open: send the new input.
        """
        link = self._check_open()

        def answer(index: int) -> TurnInterrupted:
            return TurnInterrupted(
                f"frame {index} of session {self.id} was interrupted before its output was delivered",
                session_id=self.id,
                index=index,
            )

        done = link.interrupt(answer)
        kept, untrimmed = done.kept, done.untrimmed
        tok = link.tokenizer
        text = tok.decode(list(kept)) if tok is not None and kept else ""
        self._log.info("session.interrupted", kept=len(kept), withdrawn=done.withdrawn, untrimmed=untrimmed)
        return Interrupted(kept=kept, text=text, withdrawn=done.withdrawn, trimmed=untrimmed == 0, untrimmed=untrimmed)

    # tentative context ---------------------------------------------------------------------------

    async def mark(self) -> ContextMark:
        """Remember the context as it is now, to go back to it exactly with ``rewind``.

        Needs ``rewind_tokens`` (``ValueError`` without), and a quiet session: no frame queued,
        unread or in a tick, no turn still being appended. A mark replaces the last one. The
        session goes on as usual after it; ``rewind`` can go back for as long as at most
        ``rewind_tokens`` tokens were appended since.
        """
        return await self._check_open().mark()

    async def rewind(self, mark: ContextMark) -> None:
        """Go back to ``mark``: the tokens appended since it, and the turns they began, are gone.

        The model then sees exactly what it saw at the mark (the KV cache the window had
        there is held while the mark lasts), and the next output is the one it would have
        given then (with greedy sampling; a sampled session's random stream goes on). Frames
        queued or unread must be read or interrupted first (``ValueError``); a frame in the
        tick now running is waited for. ``RewindUnavailable``, changing nothing, when more
        than ``rewind_tokens`` were appended since the mark or ``mark`` is not the current
        one. The mark still holds after it, so the session can try again from there.
        """
        await self._check_open().rewind(mark, still_open=self._check_open)

    async def keep(self, mark: ContextMark) -> None:
        """The tokens since ``mark`` stay: the mark ends, and the window moves on from the next step."""
        await self._check_open().keep(mark)

    def __aiter__(self) -> Session:
        return self

    async def __anext__(self) -> OutputFrame:
        try:
            return await self.receive()
        except SessionClosed:
            if self._link is None:
                raise
            raise StopAsyncIteration from None

    # observability -------------------------------------------------------------------------------

    def stats(self) -> SessionStats:
        link = self._link
        if link is None:
            return SessionStats(
                session_id=self.id, open=False, frames=0, deadline_misses=0, stalls=0, num_tokens=0, num_blocks=0
            )
        return link.stats(open=not self.closed)

    def __repr__(self) -> str:
        state = "closed" if self.closed else ("open" if self._link is not None else "new")
        frames = self._link.channel.counts.frames if self._link is not None else 0
        return f"Session(id={self.id}, {state}, frames={frames})"
