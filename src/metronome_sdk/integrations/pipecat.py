"""``MetronomeLLMService``: a Pipecat LLM service on an in-process Metronome engine (extra ``[pipecat]``).

One session per pipeline: opened when it starts (in a task: a model loading must not hold
up the ``StartFrame``), or at the first context when the system prompt comes from it;
closed in ``stop()``/``cancel()``. Pipecat sends the
whole context every turn; the session already holds it, so only the messages added
since the last turn are appended (the session's own replies are never sent back).
Tokens go out as ``LLMTextFrame``s between ``LLMFullResponseStartFrame`` and
``LLMFullResponseEndFrame``. An ``InterruptionFrame`` (Pipecat cancels the reply's task)
cuts the reply with ``Session.interrupt()``: no token of it is pushed after that, its
frame in flight is withdrawn, and the session's context keeps only the tokens pushed.

Errors are ``ErrorFrame``s with the category of the SDK exception
(``integrations._errors``): ``AdmissionRejected`` -> ``RATE_LIMIT``, ``CacheExhausted``
-> ``INVALID_REQUEST`` (permanent), ``EngineStalled`` -> ``SERVER``... A session the
engine ended is reopened at the next turn. Bots of Pipecat's dev runner share one
event loop, so the services given no engine share one (``SharedEngine``): one model in
memory and one admission cap for every call, closed when the last of them stops.
"""

from __future__ import annotations

import asyncio
import weakref
from collections.abc import Mapping, Sequence
from contextlib import aclosing
from typing import Any, ClassVar

from pipecat.frames.frames import (
    CancelFrame,
    EndFrame,
    Frame,
    LLMContextFrame,
    LLMFullResponseEndFrame,
    LLMFullResponseStartFrame,
    StartFrame,
)
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.frame_processor import FrameDirection
from pipecat.services.llm_service import LLMService
from pipecat.services.settings import LLMSettings
from pipecat.utils.errors import ErrorCategory

from metronome_engine import SamplingParams

from .._engine import Engine
from .._exceptions import MetronomeError
from ._conversation import ROLES, Conversation
from ._errors import error_mapping

__all__ = ["MetronomeLLMService", "SharedEngine", "context_turns"]


def context_turns(messages: Sequence[Any]) -> list[dict[str, str]]:
    """The chat turns among a Pipecat context's messages (text content only).

    Tool calls and results, images and provider-specific messages are left out: the
    session takes text turns.
    """
    turns = []
    for m in messages:
        if not isinstance(m, Mapping):
            continue
        role = "system" if m.get("role") == "developer" else m.get("role")
        content = m.get("content")
        if isinstance(content, list):
            content = "".join(p.get("text", "") for p in content if isinstance(p, Mapping) and p.get("type") == "text")
        if role in ROLES and isinstance(content, str) and content:
            turns.append({"role": role, "content": content})
    return turns


class SharedEngine:
    """The engine that the services of one event loop given no engine share.

    Made (``metronome.Engine()``, the default model) when the first of them starts, closed
    when the last of them stops: a bot process of Pipecat's dev runner holds one model and
    one admission cap while it has calls, and nothing once they end.
    """

    _by_loop: ClassVar[weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, SharedEngine]] = weakref.WeakKeyDictionary()

    def __init__(self) -> None:
        self.engine = Engine()
        self.users = 0

    @classmethod
    def acquire(cls) -> Engine:
        """The running loop's shared engine (made now if it has none); ``release()`` it when done."""
        loop = asyncio.get_running_loop()
        shared = cls._by_loop.get(loop)
        if shared is None or shared.engine.closed:
            shared = cls._by_loop[loop] = cls()
        shared.users += 1
        return shared.engine

    @classmethod
    async def release(cls, engine: Engine) -> None:
        """One user fewer of ``engine``; the last one closes it."""
        loop = asyncio.get_running_loop()
        shared = cls._by_loop.get(loop)
        if shared is None or shared.engine is not engine:
            return
        shared.users -= 1
        if shared.users == 0:
            del cls._by_loop[loop]
            await engine.aclose()

    @classmethod
    def current(cls) -> Engine | None:
        """The running loop's shared engine while a service uses it, else ``None``."""
        shared = cls._by_loop.get(asyncio.get_running_loop())
        return shared.engine if shared is not None else None


class MetronomeLLMService(LLMService):  # type: ignore[misc]
    """A Pipecat ``LLMService`` whose replies come from a Metronome session.

    ``engine``: the engine to open the session on, which the application owns (default:
    the event loop's ``SharedEngine``, held from ``start()`` to ``stop()``). ``system_prompt``:
    the session's pinned system prompt (default: the context's leading system message, read at
    the first turn).
    ``max_tokens``: the longest reply. ``sampling``: how the session samples.
    """

    def __init__(
        self,
        *,
        engine: Engine | None = None,
        system_prompt: str | None = None,
        max_tokens: int = 64,
        sampling: SamplingParams | None = None,
        **kwargs: Any,
    ) -> None:
        if engine is not None and not isinstance(engine, Engine):
            raise ValueError(f"engine must be a metronome Engine, got {type(engine).__name__}")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ValueError(f"max_tokens must be an int >= 1, got {max_tokens!r}")
        if "settings" not in kwargs:
            # every field given (Pipecat checks): the session samples as it was opened, so the rest are None
            kwargs["settings"] = LLMSettings(
                model="metronome",
                system_instruction=system_prompt,
                temperature=None if sampling is None else sampling.temperature,
                max_tokens=max_tokens,
                top_p=None,
                top_k=None,
                frequency_penalty=None,
                presence_penalty=None,
                seed=None,
                filter_incomplete_user_turns=False,
                user_turn_completion_config=None,
            )
        super().__init__(**kwargs)
        self._engine = engine
        self._shared: Engine | None = None  # the SharedEngine this service holds (no engine given)
        self._system_prompt = system_prompt
        self._max_tokens = max_tokens
        self._sampling = sampling
        self._conversation: Conversation | None = None
        self._opening: asyncio.Task[None] | None = None  # the session opening at start(), off its path
        self._seen = 0  # context messages the session has taken

    @property
    def conversation(self) -> Conversation | None:
        """The pipeline's session as a ``Conversation`` (``None`` before it opened)."""
        return self._conversation

    def can_generate_metrics(self) -> bool:
        return True

    async def start(self, frame: StartFrame) -> None:
        await super().start(frame)
        if self._engine is None and self._shared is None:
            self._shared = SharedEngine.acquire()
        if self._system_prompt is not None:
            # in a task: loading the model takes seconds, and Pipecat gives up on a pipeline whose
            # StartFrame does not come through in time; the first turn waits for it
            self._opening = self.create_task(self._open_early(), name="metronome_open")

    async def _open_early(self) -> None:
        try:
            await self._open(self._system_prompt)
        except (MetronomeError, ValueError) as exc:  # refused now: the first turn tries again
            await self._report(exc)

    async def stop(self, frame: EndFrame) -> None:
        await super().stop(frame)
        await self._close()

    async def cancel(self, frame: CancelFrame) -> None:
        await super().cancel(frame)
        await self._close()

    async def _open(self, system_prompt: str | None) -> Conversation:
        if self._engine is None and self._shared is None:  # a turn before start(): hold the shared engine
            self._shared = SharedEngine.acquire()
        engine = self._engine or self._shared
        assert engine is not None
        await engine.start()
        if engine.tokenizer is None:
            raise ValueError("MetronomeLLMService needs an engine with a tokenizer")
        session = engine.session(system_prompt, sampling=self._sampling, timeout=0)
        await session.open()
        self._system_prompt = system_prompt
        self._conversation = Conversation(session, engine.tokenizer, has_system_prompt=system_prompt is not None)
        self._seen = 0
        return self._conversation

    async def _close(self) -> None:
        opening, self._opening = self._opening, None
        if opening is not None:
            await self.cancel_task(opening)
        conversation, self._conversation = self._conversation, None
        if conversation is not None:
            await conversation.aclose()
        shared, self._shared = self._shared, None
        if shared is not None:
            await SharedEngine.release(shared)

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, LLMContextFrame):
            await self._respond(frame.context)
        else:
            await self.push_frame(frame, direction)

    def _new_turns(self, messages: list[dict[str, str]]) -> list[dict[str, str]]:
        """The turns added since the session last took the context (its own replies excluded)."""
        if len(messages) < self._seen:  # the context was replaced: take it all as new turns
            self._seen = 0
        fresh = messages[self._seen :]
        if self._seen == 0 and fresh and fresh[0]["role"] == "system" and fresh[0]["content"] == self._system_prompt:
            fresh = fresh[1:]
        return [m for m in fresh if m["role"] != "assistant" or self._seen == 0]

    async def _respond(self, context: LLMContext) -> None:
        await self.push_frame(LLMFullResponseStartFrame())
        await self.start_processing_metrics()
        await self.start_ttfb_metrics()
        try:
            opening, self._opening = self._opening, None
            if opening is not None:
                await opening  # the session opened at start(), or the refusal it reported
            messages = context_turns(context.get_messages())
            conversation = self._conversation
            if conversation is None or conversation.session.closed:
                prompt = self._system_prompt
                if prompt is None and messages and messages[0]["role"] == "system":
                    prompt = messages[0]["content"]
                conversation = await self._open(prompt)
            turns = self._new_turns(messages)
            self._seen = len(messages)
            first = True
            # closed even when Pipecat cancels this task (an InterruptionFrame): closing cuts the reply
            async with aclosing(conversation.reply(turns, max_tokens=self._max_tokens)) as pieces:
                async for piece in pieces:
                    if first:
                        first = False
                        await self.stop_ttfb_metrics()
                    if piece.text:
                        await self._push_llm_text(piece.text)
        except (MetronomeError, ValueError) as exc:
            await self._report(exc)
        finally:
            await self.stop_processing_metrics()
            await self.push_frame(LLMFullResponseEndFrame())

    async def _report(self, exc: Exception) -> None:
        row = error_mapping(exc)
        await self.push_error(
            f"Metronome: {type(exc).__name__}: {exc}",
            exception=exc,
            category=ErrorCategory[row.pipecat],
            force_treat_as_permanent=not row.retryable,
        )
