"""A session driven by chat messages: what every adapter (server, Pipecat, LiveKit) shares.

Voice frameworks speak in chat messages and resend the whole history every turn; a
session holds its context. A ``Conversation`` renders only the turns it is given (the
adapter decides which are new, ``new_turns``) with the model's chat template, sends them
as one input frame, and streams the reply one frame per tick.

A reply cut short (the consumer cancelled it, or stopped reading: barge-in) calls
``Session.interrupt()``: the frame in flight is withdrawn, no token of it is delivered, and
the session's context keeps only the reply tokens that were (``last_cut`` says which).
"""

from __future__ import annotations

from collections.abc import AsyncGenerator, Mapping, Sequence
from dataclasses import dataclass

import anyio

from .._codec import TextTokenizer
from .._exceptions import MetronomeError
from .._frames import InputFrame
from .._session import Interrupted, Session

__all__ = ["Conversation", "ReplyPiece", "new_turns", "render_turns", "split_system"]

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


def split_system(messages: Sequence[Mapping[str, str]]) -> tuple[str | None, list[Mapping[str, str]]]:
    """A leading system message (the session's prompt), and the turns after it."""
    if messages and messages[0]["role"] == "system":
        return messages[0]["content"], list(messages[1:])
    return None, list(messages)


def new_turns(messages: Sequence[Mapping[str, str]], system_prompt: str | None) -> list[Mapping[str, str]]:
    """What an open session has not seen: the messages after the last assistant message.

    The session holds its own replies (as far as they were delivered, even where the client
    kept only what it played); a leading system message equal to the session's prompt is not new.
    """
    last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=-1)
    turns = list(messages[last + 1 :])
    if last < 0 and turns and turns[0]["role"] == "system" and turns[0]["content"] == system_prompt:
        turns = turns[1:]
    return turns


class Conversation:
    """Chat turns in, reply tokens out, over one open ``Session``.

    ``tokenizer`` is the session's engine's (``engine.tokenizer``); ``has_system_prompt``
    says whether the session was opened with one (then even its first turns are
    rendered as later turns of a chat). ``last_cut`` is what ``Session.interrupt()`` said
    when a reply was last cut short (``None`` until one is).
    """

    def __init__(self, session: Session, tokenizer: TextTokenizer, *, has_system_prompt: bool) -> None:
        self.session = session
        self._tokenizer = tokenizer
        self._started = has_system_prompt
        self.turns = 0  # replies begun
        self.last_cut: Interrupted | None = None

    async def reply(self, turns: Sequence[Mapping[str, str]], *, max_tokens: int) -> AsyncGenerator[ReplyPiece, None]:
        """Append ``turns`` and stream the reply until the model ends its turn or ``max_tokens``.

        One piece per output frame: a token, or up to the session's ``decode_tokens``
        (never past ``max_tokens``). Raises what the session raises (``EngineStalled``, ``CacheExhausted``,
        ``LoadShed``...); pieces yielded before the error were delivered. Breaking off
        (``aclose()``) or being cancelled cuts the reply (``Session.interrupt()``): its frame in
        flight is withdrawn, and the context keeps the pieces yielded so far.
        """
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens must be an int >= 1, got {max_tokens!r}")
        if not turns:
            raise ValueError("there is no new message to answer: end the messages with a user turn")
        for t in turns:
            if t.get("role") not in ROLES or not isinstance(t.get("content"), str):
                raise ValueError(f"a turn is {{'role': one of {ROLES}, 'content': str}}, got {dict(t)!r}")
        ids = render_turns(self._tokenizer, turns, first=not self._started)
        self._started = True
        self.turns += 1
        tokens: list[int] = []
        text = ""
        frame: InputFrame | None = InputFrame.from_tokens(ids)
        wanted = self.session.decode_tokens
        ended = False  # the reply finished, or failed with the session's own error: nothing to cut
        try:
            while len(tokens) < max_tokens:
                self.session.decode_tokens = min(wanted, max_tokens - len(tokens))  # never past max_tokens
                try:
                    # step() is cancel-safe: cancelled, its frame is withdrawn and its output never delivered
                    out = await self.session.step(frame)
                except MetronomeError:
                    ended = True  # the frame's answer was this error: nothing is in flight
                    raise
                frame = None
                tokens.extend(out.tokens)
                # decode the whole reply so far: one token may hold half of a UTF-8 character
                now = self._tokenizer.decode(tokens)
                if now.endswith("\ufffd") and not out.stop:
                    yield ReplyPiece("", False, len(out.tokens))
                    continue
                piece, text = now[len(text) :], now
                if out.stop:
                    ended = True
                yield ReplyPiece(piece, out.stop, len(out.tokens))
                if out.stop:
                    return
            ended = True
        finally:
            self.session.decode_tokens = wanted
            if not ended and not self.session.closed:
                self.last_cut = self.session.interrupt()

    async def aclose(self) -> None:
        """Close the session and return its blocks; safe when cancelled."""
        with anyio.CancelScope(shield=True):
            await self.session.aclose()
