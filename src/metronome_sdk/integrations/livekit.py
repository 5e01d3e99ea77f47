"""``MetronomeLLM``: a LiveKit Agents ``llm.LLM`` on ``metronome serve`` or an in-process engine (extra ``[livekit]``).

LiveKit runs each job in its own process by default (and its thread executor gives each
job its own event loop), so an engine inside every job would load the model per call and
lose the shared admission cap: by default the plugin talks to one Metronome server. Each
``MetronomeLLM`` is one named session on it (``X-Metronome-Session``), so the server holds
the conversation and appends only what is new; create one per agent session, and
``aclose()`` it when the call ends (the session is closed on the server then, not at its
idle timeout). ``worker_options()`` (``_dispatch.py``) makes LiveKit dispatch jobs by
Metronome's admission headroom rather than the machine's CPU.

``MetronomeLLM(engine=...)`` serves the chats from an engine in this process instead,
for programs that run their agent sessions on one event loop (the engine's): one session
per ``MetronomeLLM``, opened at its first chat and closed by ``aclose()``. The engine is
the application's (``async with metronome.Engine() as engine``); the plugin never closes it.

Retries go through LiveKit's own ``LLMStream`` machinery (``conn_options.max_retry``),
paced by Metronome, the same in both modes (the table: ``integrations._errors``): an
admission refusal (429) or a stall before the first token (503) is retried after the
delay Metronome advised (``retry-after-ms``, ``AdmissionRejected.retry_after``), not
LiveKit's fixed ``retry_interval``, which only paces errors that carry no advice. A
refusal marked not retryable (``CacheExhausted``: 400) is not retried, and neither is an
error after output was sent (resending would repeat words already spoken). Closing a
stream mid-reply (LiveKit's interruption) cuts it with ``Session.interrupt()``: the
session's context keeps only the text the stream delivered.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import uuid
from contextlib import aclosing
from typing import Any

import aiohttp
import anyio
from livekit.agents import APIConnectionError, APIConnectOptions, APIError, APIStatusError, llm
from livekit.agents.types import DEFAULT_API_CONNECT_OPTIONS, NOT_GIVEN, NotGivenOr

from .._engine import Engine
from .._exceptions import MetronomeError
from .._session import Interrupted
from ._conversation import Conversation, new_turns, split_system
from ._dispatch import AdmissionLoad, admission_load, worker_options
from ._errors import error_mapping, retry_after_seconds

__all__ = ["AdmissionLoad", "MetronomeLLM", "MetronomeLLMStream", "admission_load", "chat_turns", "worker_options"]

SESSION_HEADER = "X-Metronome-Session"


def chat_turns(chat_ctx: llm.ChatContext) -> list[dict[str, str]]:
    """The text turns of a LiveKit chat context (tool calls and their outputs are left out)."""
    turns = []
    for item in chat_ctx.items:
        if item.type != "message":
            continue
        role = "system" if item.role == "developer" else item.role
        text = item.text_content
        if role in ("system", "user", "assistant") and text:
            turns.append({"role": role, "content": text})
    return turns


class MetronomeLLM(llm.LLM[None]):
    """Replies from ``metronome serve`` at ``base_url`` (or from ``engine``), one session per instance.

    ``api_key``: the server's token (``METRONOME_TOKEN``), if it has one.
    ``session_key``: the named session (default: a fresh one per instance).
    ``max_tokens``: the longest reply (default: the server's; in process, 128 as the server's).
    ``engine``: serve the chats from this in-process engine instead of a server (on its
    event loop); ``stall_retry_after`` is then the wait before retrying a stall that came
    before any output (the server's ``--stall-retry-after`` otherwise).
    """

    def __init__(
        self,
        *,
        base_url: str = "http://127.0.0.1:8000/v1",
        api_key: str | None = None,
        session_key: str | None = None,
        max_tokens: int | None = None,
        model: str = "metronome",
        engine: Engine | None = None,
        stall_retry_after: float = 1.0,
    ) -> None:
        super().__init__()
        if engine is not None and not isinstance(engine, Engine):
            raise ValueError(f"engine must be a metronome Engine, got {type(engine).__name__}")
        if engine is not None and (api_key is not None or session_key is not None):
            raise ValueError("api_key and session_key name a metronome serve session: give them or engine, not both")
        if isinstance(stall_retry_after, bool) or not isinstance(stall_retry_after, int | float):
            raise ValueError(f"stall_retry_after must be seconds >= 0, got {stall_retry_after!r}")
        if not (math.isfinite(stall_retry_after) and stall_retry_after >= 0):
            raise ValueError(f"stall_retry_after must be seconds >= 0, got {stall_retry_after!r}")
        if not base_url.startswith(("http://", "https://")):
            raise ValueError(f"base_url must be an http(s) URL like 'http://127.0.0.1:8000/v1', got {base_url!r}")
        if max_tokens is not None and (
            isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1
        ):
            raise ValueError(f"max_tokens must be an int >= 1 or None, got {max_tokens!r}")
        self._url = base_url.rstrip("/") + "/chat/completions"
        self._sessions = base_url.rstrip("/") + "/sessions"
        self._api_key = api_key
        self.session_key = session_key or f"livekit-{uuid.uuid4().hex}"
        self._max_tokens = max_tokens
        self._model = model
        self._http: aiohttp.ClientSession | None = None
        self._local = _LocalSession(engine, stall_retry_after) if engine is not None else None

    @property
    def engine(self) -> Engine | None:
        """The in-process engine the chats are served from, or ``None`` when talking to a server."""
        return self._local.engine if self._local is not None else None

    @property
    def last_cut(self) -> Interrupted | None:
        """In process: what ``Session.interrupt()`` kept of the last reply cut short (``None`` until one is)."""
        conversation = self._local.conversation if self._local is not None else None
        return conversation.last_cut if conversation is not None else None

    @property
    def model(self) -> str:
        return self._model

    @property
    def provider(self) -> str:
        return "metronome"

    def _client(self) -> aiohttp.ClientSession:
        if self._http is None or self._http.closed:
            self._http = aiohttp.ClientSession()
        return self._http

    async def aclose(self) -> None:
        """Close the session, on the server or in process (its blocks and admission place go back now)."""
        await super().aclose()
        if self._local is not None:
            await self._local.aclose()
        if self._http is None:
            return
        headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
        try:
            async with self._http.delete(f"{self._sessions}/{self.session_key}", headers=headers) as resp:
                await resp.read()  # 404: never opened, or already closed for being idle
        except aiohttp.ClientError:
            pass  # the server is gone; its idle timeout would have closed the session anyway
        finally:
            await self._http.close()
            self._http = None

    def chat(
        self,
        *,
        chat_ctx: llm.ChatContext,
        tools: list[llm.Tool] | None = None,
        conn_options: APIConnectOptions = DEFAULT_API_CONNECT_OPTIONS,
        parallel_tool_calls: NotGivenOr[bool] = NOT_GIVEN,
        tool_choice: NotGivenOr[llm.ToolChoice] = NOT_GIVEN,
        extra_kwargs: NotGivenOr[dict[str, Any]] = NOT_GIVEN,
    ) -> MetronomeLLMStream:
        if tools:
            raise ValueError("MetronomeLLM takes no tools: metronome serve answers text turns only")
        # the stream paces its own retries (the server's retry-after-ms); LiveKit's fixed
        # interval then only adds its own first-retry pause
        paced = dataclasses.replace(conn_options, retry_interval=0.0)
        return MetronomeLLMStream(
            self, chat_ctx=chat_ctx, conn_options=paced, fallback_interval=conn_options.retry_interval
        )


class MetronomeLLMStream(llm.LLMStream):
    """One reply from ``metronome serve``, as LiveKit ``ChatChunk``s."""

    def __init__(
        self,
        owner: MetronomeLLM,
        *,
        chat_ctx: llm.ChatContext,
        conn_options: APIConnectOptions,
        fallback_interval: float,
    ) -> None:
        super().__init__(owner, chat_ctx=chat_ctx, tools=[], conn_options=conn_options)
        self._owner = owner
        self._fallback_interval = fallback_interval
        self._resume_at: float | None = None  # when the server said a retry may come
        self.attempts = 0

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        if self._resume_at is not None:
            await asyncio.sleep(max(0.0, self._resume_at - loop.time()))
            self._resume_at = None
        self.attempts += 1
        owner = self._owner
        if owner._local is not None:
            await self._run_local(owner._local, loop)
            return
        body: dict[str, Any] = {"messages": chat_turns(self._chat_ctx), "stream": True}
        if owner._max_tokens is not None:
            body["max_tokens"] = owner._max_tokens
        headers = {SESSION_HEADER: owner.session_key}
        if owner._api_key:
            headers["Authorization"] = f"Bearer {owner._api_key}"
        timeout = aiohttp.ClientTimeout(sock_connect=self._conn_options.timeout, sock_read=self._conn_options.timeout)
        sent = False
        try:
            async with owner._client().post(owner._url, json=body, headers=headers, timeout=timeout) as resp:
                if resp.status != 200:
                    raise await self._refusal(resp, loop.time())
                done = False
                async for raw in resp.content:
                    line = raw.decode("utf-8", "replace").strip()
                    if not line.startswith("data:"):
                        continue
                    data = line[5:].strip()
                    if data == "[DONE]":
                        done = True
                        break
                    event = json.loads(data)
                    if "error" in event:  # after output: resending would repeat what was said
                        error = event["error"]
                        raise APIError(
                            f"metronome: {error.get('code')}: {error.get('message')}", body=error, retryable=False
                        )
                    sent = self._forward(event) or sent
                if not done:
                    raise APIConnectionError(
                        "metronome serve ended the stream without finishing it", retryable=not sent
                    )
        except (aiohttp.ClientError, TimeoutError) as exc:
            self._resume_at = loop.time() + self._fallback_interval
            raise APIConnectionError(f"metronome serve unreachable: {exc!r}", retryable=not sent) from exc

    async def _run_local(self, local: _LocalSession, loop: asyncio.AbstractEventLoop) -> None:
        """One attempt on the in-process session, its failures mapped as ``metronome serve`` maps them."""
        sent = False
        ident = f"chatcmpl-{uuid.uuid4().hex[:24]}"
        scope = local.take_turn()
        try:
            with scope:  # cancelled by a newer chat on this session
                async with local.lock:
                    conversation, turns = await local.open(chat_turns(self._chat_ctx))
                    max_tokens = self._owner._max_tokens or _LOCAL_MAX_TOKENS
                    # closed when LiveKit closes the stream (an interruption): closing cuts the reply
                    async with aclosing(conversation.reply(turns, max_tokens=max_tokens)) as pieces:
                        async for piece in pieces:
                            if piece.text:
                                delta = llm.ChoiceDelta(role="assistant", content=piece.text)
                                self._event_ch.send_nowait(llm.ChatChunk(id=ident, delta=delta))
                                sent = True
        except (MetronomeError, ValueError) as exc:
            raise self._failure(exc, sent, loop.time(), local.stall_retry_after) from exc
        finally:
            local.turn_done(scope)
        if scope.cancelled_caught:
            raise APIError("metronome: Interrupted: a newer chat on this session cut the reply", retryable=False)

    def _failure(self, exc: Exception, sent: bool, now: float, stall_retry_after: float) -> APIError:
        """The LiveKit error for an SDK exception, as ``metronome serve`` would have answered it."""
        row = error_mapping(exc)
        body: dict[str, Any] = {"code": row.exception, "message": str(exc), "type": row.openai_type}
        if sent:  # after output: resending would repeat what was said
            return APIError(f"metronome: {row.exception}: {exc}", body=body, retryable=False)
        if row.retryable:
            body["retry_after"] = delay = retry_after_seconds(exc, stall_retry_after)
            self._resume_at = now + delay
        return APIStatusError(
            f"metronome: {row.exception}: {exc}", status_code=row.status, body=body, retryable=row.retryable
        )

    def _forward(self, event: dict[str, Any]) -> bool:
        """Hand one stream event to LiveKit; whether it carried text."""
        ident = str(event.get("id", ""))
        usage = event.get("usage")
        if usage:
            self._event_ch.send_nowait(
                llm.ChatChunk(
                    id=ident,
                    usage=llm.CompletionUsage(
                        completion_tokens=int(usage.get("completion_tokens", 0)),
                        prompt_tokens=int(usage.get("prompt_tokens", 0)),
                        total_tokens=int(usage.get("total_tokens", 0)),
                    ),
                )
            )
        for choice in event.get("choices") or []:
            content = (choice.get("delta") or {}).get("content")
            if content:
                self._event_ch.send_nowait(
                    llm.ChatChunk(id=ident, delta=llm.ChoiceDelta(role="assistant", content=content))
                )
                return True
        return False

    async def _refusal(self, resp: aiohttp.ClientResponse, now: float) -> APIStatusError:
        """The error for a refused request, remembering when the server said to come back."""
        try:
            payload = await resp.json(content_type=None)
            error = payload.get("error", {}) if isinstance(payload, dict) else {}
        except (ValueError, aiohttp.ClientError):
            error = {}
        advice = resp.headers.get("retry-after-ms")
        should_retry = resp.headers.get("x-should-retry")
        retryable = should_retry == "true" or (
            should_retry is None and (resp.status in (408, 429) or resp.status >= 500)
        )
        if retryable:
            delay = float(advice) / 1000 if advice is not None else self._fallback_interval
            self._resume_at = now + delay
        return APIStatusError(
            f"metronome: {error.get('code', resp.status)}: {error.get('message', resp.reason)}",
            status_code=resp.status,
            body=error or None,
            retryable=retryable,
        )


_LOCAL_MAX_TOKENS = 128  # a reply's length when none is given: metronome serve's default


class _LocalSession:
    """The in-process session of one ``MetronomeLLM``: opened at its first chat, one reply at a time.

    A newer chat cuts the reply in flight (the caller spoke again), as a newer request on a
    named session of ``metronome serve`` does.
    """

    def __init__(self, engine: Engine, stall_retry_after: float) -> None:
        self.engine = engine
        self.stall_retry_after = float(stall_retry_after)
        self.conversation: Conversation | None = None
        self.system_prompt: str | None = None
        self.lock = asyncio.Lock()
        self._reply: anyio.CancelScope | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def take_turn(self) -> anyio.CancelScope:
        """The scope of a new reply; the reply in flight, if any, is cut."""
        if self._reply is not None:
            self._reply.cancel()
        self._reply = anyio.CancelScope()
        return self._reply

    def turn_done(self, scope: anyio.CancelScope) -> None:
        if self._reply is scope:
            self._reply = None

    async def open(self, messages: list[dict[str, str]]) -> tuple[Conversation, list[dict[str, str]]]:
        """The open conversation (opened now, or again if the engine ended it) and the turns it has not seen."""
        loop = asyncio.get_running_loop()
        if self._loop is not None and self._loop is not loop:
            raise RuntimeError(
                "MetronomeLLM(engine=...) serves chats on one event loop; this chat runs on another "
                "(LiveKit gives each job its own loop): use metronome serve (base_url=...) there"
            )
        conversation = self.conversation
        if conversation is not None and conversation.session.closed:  # shed or broken: start afresh
            self.conversation = None
            await conversation.aclose()
            conversation = None
        if conversation is not None:
            return conversation, [dict(t) for t in new_turns(messages, self.system_prompt)]
        await self.engine.start()
        tokenizer = self.engine.tokenizer
        if tokenizer is None:
            raise ValueError("MetronomeLLM(engine=...) needs an engine with a tokenizer")
        system, turns = split_system(messages)
        session = self.engine.session(system, timeout=0)  # refused at once: LiveKit retries after retry_after
        await session.open()
        self._loop = loop
        self.conversation = Conversation(session, tokenizer, has_system_prompt=system is not None)
        self.system_prompt = system
        return self.conversation, [dict(t) for t in turns]

    async def aclose(self) -> None:
        if self._reply is not None:
            self._reply.cancel()
        async with self.lock:
            conversation, self.conversation = self.conversation, None
            if conversation is not None:
                await conversation.aclose()
