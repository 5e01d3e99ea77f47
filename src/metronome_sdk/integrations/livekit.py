"""``MetronomeLLM``: a LiveKit Agents ``llm.LLM`` that talks to ``metronome serve`` (extra ``[livekit]``).

LiveKit runs each job in its own process by default, so an engine inside every job
would load the model per call and lose the shared admission cap: the plugin talks to
one Metronome server. Each ``MetronomeLLM`` is one named session on it
(``X-Metronome-Session``), so the server holds the conversation and appends only
what is new; create one per agent session, and ``aclose()`` it when the call ends
(the session is closed on the server then, not at its idle timeout).

Retries go through LiveKit's own ``LLMStream`` machinery (``conn_options.max_retry``),
paced by the server: a 429 (admission refused) or a 503 before the first token (a
stall) is retried after the ``retry-after-ms`` the server sent, not LiveKit's fixed
``retry_interval``, which only paces errors that carry no advice. A refusal the server
marks ``x-should-retry: false`` (``CacheExhausted``: 400) is not retried, and neither
is an error after output was sent (an error event in the stream: resending would
repeat words already spoken).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import uuid
from typing import Any

import aiohttp
from livekit.agents import APIConnectionError, APIConnectOptions, APIError, APIStatusError, llm
from livekit.agents.types import DEFAULT_API_CONNECT_OPTIONS, NOT_GIVEN, NotGivenOr

__all__ = ["MetronomeLLM", "MetronomeLLMStream", "chat_turns"]

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
    """Replies from ``metronome serve`` at ``base_url``, one named session per instance.

    ``api_key``: the server's token (``METRONOME_TOKEN``), if it has one.
    ``session_key``: the named session (default: a fresh one per instance).
    ``max_tokens``: the longest reply (default: the server's).
    """

    def __init__(
        self,
        *,
        base_url: str = "http://127.0.0.1:8000/v1",
        api_key: str | None = None,
        session_key: str | None = None,
        max_tokens: int | None = None,
        model: str = "metronome",
    ) -> None:
        super().__init__()
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
        """Close the named session on the server (its blocks and admission place go back now)."""
        await super().aclose()
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
