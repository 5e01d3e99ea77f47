"""A session driven by chat messages: what every adapter (server, Pipecat, LiveKit) shares.

Voice frameworks speak in chat messages and resend the whole history every turn; a
session holds its context. A ``Conversation`` renders only the turns it is given (the
adapter decides which are new) with the model's chat template, sends them as one
input frame, and streams the reply one token per tick.

A reply cut short (the consumer cancelled, or stopped reading) leaves outputs the
session still owes: frames sent whose outputs were not taken. The next reply takes
them first, so a later turn never reads an earlier turn's tokens.
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass

import anyio

from .._codec import TextTokenizer
from .._exceptions import MetronomeError
from .._frames import InputFrame, OutputFrame
from .._session import Session

__all__ = ["Conversation", "ReplyPiece", "render_turns"]

ROLES = ("system", "user", "assistant")


@dataclass(frozen=True, slots=True)
class ReplyPiece:
    """Text one output frame added to the reply (may be empty: half of a multi-byte character)."""

    text: str
    stop: bool  # the model ended its turn in this frame
    tokens: int  # tokens the frame carried (several when the session decodes several a tick)


def render_turns(tokenizer: TextTokenizer, turns: Sequence[Mapping[str, str]], *, first: bool) -> list[int]:
    """Tokens of ``turns`` in the chat template, ending with the assistant's generation prompt.

    The first turns of a session are the template's whole rendering; later ones are
    only what they add, found by rendering behind a fixed anchor with and without them.
    """
    messages = [{"role": t["role"], "content": t["content"]} for t in turns]
    if first:
        return tokenizer.chat(messages, add_generation_prompt=True)
    anchor = [{"role": "system", "content": "."}]
    before = tokenizer.chat(anchor, add_generation_prompt=False)
    full = tokenizer.chat(anchor + messages, add_generation_prompt=True)
    if full[: len(before)] != before:  # a template that rewrites earlier turns: send the text alone
        return tokenizer.encode("\n".join(m["content"] for m in messages))
    return full[len(before) :]


class Conversation:
    """Chat turns in, reply tokens out, over one open ``Session``.

    ``tokenizer`` is the session's engine's (``engine.tokenizer``); ``has_system_prompt``
    says whether the session was opened with one (then even its first turns are
    rendered as later turns of a chat).
    """

    def __init__(self, session: Session, tokenizer: TextTokenizer, *, has_system_prompt: bool) -> None:
        self.session = session
        self._tokenizer = tokenizer
        self._started = has_system_prompt
        self._owed = 0  # outputs of frames sent and not yet taken (a reply cut short)
        self.turns = 0  # replies begun

    @property
    def owed(self) -> int:
        return self._owed

    async def settle(self) -> None:
        """Take the outputs a cut reply left behind, so the next reply starts in step.

        Their errors are dropped too: they belong to a reply nobody reads any more.
        """
        while self._owed > 0:
            try:
                await self.session.receive()
            except MetronomeError:
                if self.session.closed:
                    self._owed = 0
                    raise
            self._owed -= 1

    async def reply(self, turns: Sequence[Mapping[str, str]], *, max_tokens: int) -> AsyncGenerator[ReplyPiece, None]:
        """Append ``turns`` and stream the reply until the model ends its turn or ``max_tokens``.

        One piece per output frame: a token, or up to the session's ``decode_tokens``
        (never past ``max_tokens``). Raises what the session raises (``EngineStalled``, ``CacheExhausted``,
        ``LoadShed``...); pieces yielded before the error were delivered. Breaking
        off (or being cancelled) is safe: the next reply settles first.
        """
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens must be an int >= 1, got {max_tokens!r}")
        if not turns:
            raise ValueError("there is no new message to answer: end the messages with a user turn")
        for t in turns:
            if t.get("role") not in ROLES or not isinstance(t.get("content"), str):
                raise ValueError(f"a turn is {{'role': one of {ROLES}, 'content': str}}, got {dict(t)!r}")
        await self.settle()
        ids = render_turns(self._tokenizer, turns, first=not self._started)
        self._started = True
        self.turns += 1
        tokens: list[int] = []
        text = ""
        frame: InputFrame | None = InputFrame.from_tokens(ids)
        wanted = self.session.decode_tokens
        try:
            while len(tokens) < max_tokens:
                self.session.decode_tokens = min(wanted, max_tokens - len(tokens))  # never past max_tokens
                out = await self._step(frame)
                frame = None
                tokens.extend(out.tokens)
                # decode the whole reply so far: one token may hold half of a UTF-8 character
                now = self._tokenizer.decode(tokens)
                if now.endswith("\ufffd") and not out.stop:
                    yield ReplyPiece("", False, len(out.tokens))
                    continue
                piece, text = now[len(text) :], now
                yield ReplyPiece(piece, out.stop, len(out.tokens))
                if out.stop:
                    return
        finally:
            self.session.decode_tokens = wanted

    async def _step(self, frame: InputFrame | None) -> OutputFrame:
        self._owed += 1  # before sending: a cancel after the frame is queued still leaves it owed
        try:
            await self.session.send(frame)
        except Exception:  # refused before anything was queued
            self._owed -= 1
            raise
        try:
            out = await self.session.receive()
        except MetronomeError:
            self._owed -= 1  # the frame's answer was this error
            raise
        self._owed -= 1
        return out

    async def aclose(self) -> None:
        """Close the session and return its blocks; safe when cancelled."""
        with anyio.CancelScope(shield=True):
            await self.session.aclose()
