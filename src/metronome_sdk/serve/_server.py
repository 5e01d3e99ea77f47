"""``metronome serve``: OpenAI-compatible chat completions on the embedded engine (aiohttp).

``POST /v1/chat/completions`` (streaming and not). Without a session key a request
gets a session of its own, closed when it is answered. With one (the
``X-Metronome-Session`` header or the ``metronome_session`` field) the session lives
on between requests and holds the context: a request to it sends the messages after
its last assistant message (or only the new ones). The first system message opens a
session as its system prompt.

Failures, never silence (the table: docs/integrations.md): a full admission cap is 429
with ``retry-after-ms`` and an OpenAI error body whose ``code`` names the SDK exception;
a failure before the first token is its HTTP status; after it, an error event in the
stream; ``CacheExhausted`` is 400 with ``x-should-retry: false``. Bad input is 400,
401 without the token, 413 past ``max_body``, 415 when not sent as JSON.
``DELETE /v1/sessions/{key}`` closes a named session at once (the call ended); one
idle for ``idle_timeout`` closes by itself. ``GET /metrics`` (Prometheus: the engine's
and the server's), ``GET /healthz``; as one replica of many, ``/readyz`` and the
``X-Metronome-Replica`` header (``_replica.py``). With ``ServeConfig.realtime``, ``GET /v1/realtime``
is the OpenAI Realtime API over WebSocket (``_realtime.py``, docs/realtime.md): one
connection is one session, refused before the upgrade with 429 (or 503) and ``Retry-After``.

Why this module is past 400 lines: it is one HTTP API, whose routes share one session
registry, one set of refusal rules and one writer for streamed and whole replies; the
parts that stand alone are elsewhere (the wire format ``_openai.py``, the registry
``_sessions.py``, the settings ``_config.py``, the error table ``integrations/_errors.py``).
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import AsyncGenerator, Awaitable, Callable, Mapping, Sequence
from types import TracebackType
from typing import Any

import anyio
from aiohttp import web

from metronome_engine import SamplingParams

from .._bearer import bearer_matches
from .._engine import Engine
from .._log import get_logger
from .._session import Session
from ..integrations._conversation import Conversation, ReplyPiece, new_turns, split_system
from ..integrations._errors import ErrorMapping, error_mapping, retry_after_seconds
from ..voice._admission import VoiceAdmission
from ..voice._agent import TurnLatency
from ..voice._piper import PiperTTS
from ..voice._protocols import SpeechToText, TextToSpeech
from ..voice._text_turn import TextTurnModel
from ..voice._vad import VoiceActivityDetector, default_turn_detector
from . import _openai as oai
from ._config import ServeConfig
from ._metrics import ServeMetrics
from ._realtime import serve_realtime
from ._replica import Replica
from ._sessions import Named, SessionRegistry

__all__ = ["ChatServer"]

_INTERRUPTED = ErrorMapping("Interrupted", 409, "interrupted", "UNKNOWN", False)
_SHUTTING_DOWN = ErrorMapping("ServerShuttingDown", 503, "server_error", "SERVER", True)
_NOT_HERE = ErrorMapping("SessionNotFound", 404, "invalid_request_error", "INVALID_REQUEST", False)


def _headers(row: ErrorMapping, retry_after: float | None) -> dict[str, str]:
    headers = {"x-should-retry": "true" if row.retryable else "false"}
    if retry_after is not None:
        headers["retry-after-ms"] = str(max(1, math.ceil(retry_after * 1000)))
        headers["retry-after"] = str(max(1, math.ceil(retry_after)))
    return headers


def _error_response(row: ErrorMapping, message: str, retry_after: float | None = None) -> web.Response:
    return web.json_response(
        oai.error_body(row, message, retry_after=retry_after), status=row.status, headers=_headers(row, retry_after)
    )


@web.middleware
async def _json_errors(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> Any:
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        row = ErrorMapping(exc.reason.replace(" ", ""), exc.status, "invalid_request_error", "INVALID_REQUEST", False)
        return _error_response(row, exc.reason)
    except asyncio.CancelledError:
        raise
    except Exception:  # a bug of ours: logged here, never shown to the client
        get_logger().exception("serve.request_failed", path=request.path)
        row = ErrorMapping("InternalError", 500, "server_error", "UNKNOWN", True)
        return _error_response(row, "the server failed to handle this request; see its log")


class ChatServer:
    """Serves ``engine`` over OpenAI's chat-completions API.

    ``sampling`` is how every session samples (greedy by default; a request's
    ``temperature`` and the like are accepted and not applied). ``async with`` starts
    (loading the model if the engine has not) and stops it; stopping interrupts every
    reply with an error event and closes every session. ``app`` is the aiohttp
    application; ``metrics`` the server's own counters.

    With ``config.realtime``, ``/v1/realtime`` answers speech with the demo's voice:
    ``stt`` and ``tts`` (by default Whisper tiny.en and Piper's joe voice, the ``[voice]``
    extra, loaded by ``start()``), and a turn detector per connection from ``vad``
    (by default ``default_turn_detector``). ``text_turn`` reads the words at a pause under
    ``semantic_vad`` (by default ``TextTurn``, loaded by ``start()`` with the default voice;
    with a voice of your own, ``semantic_vad`` ends turns as ``server_vad`` unless you give one).
    """

    def __init__(
        self,
        engine: Engine,
        config: ServeConfig | None = None,
        *,
        sampling: SamplingParams | None = None,
        stt: SpeechToText | None = None,
        tts: TextToSpeech | None = None,
        vad: Callable[[], VoiceActivityDetector] | None = None,
        text_turn: TextTurnModel | None = None,
    ) -> None:
        if not isinstance(engine, Engine):
            raise ValueError(f"engine must be a metronome Engine, got {type(engine).__name__}")
        if config is not None and not isinstance(config, ServeConfig):
            raise ValueError(f"config must be a ServeConfig, got {type(config).__name__}")
        self.engine = engine
        self.config = config or ServeConfig()
        self.metrics = ServeMetrics()
        self._sampling = sampling
        self._stt, self._tts, self._vad = stt, tts, vad
        self._own_voice: list[PiperTTS] = []  # the voices this server started, and stops
        if text_turn is not None and not isinstance(text_turn, TextTurnModel):
            raise ValueError(f"text_turn must have finished(text), got {text_turn!r}")
        self._text_turn = text_turn
        realtime = self.config.realtime
        # Realtime callers are admitted on what they hear too; the voice is timed at start-up
        # only where the server loads it (a voice given here calibrates from its first turns)
        self.voice_admission: VoiceAdmission | None = None
        if realtime is not None and realtime.voice_objective is not None:
            self.voice_admission = VoiceAdmission(realtime.voice_objective, retry_after=self.config.stall_retry_after)
        self._probe = stt is None and tts is None
        self._realtime_calls = 0  # connections open (admitted and upgraded, or being opened)
        self._registry = SessionRegistry(idle_timeout=self.config.idle_timeout)
        self._replies: set[anyio.CancelScope] = set()  # every reply in flight, for shutdown
        self._closing = False
        self._runner: web.AppRunner | None = None
        self._reaper: asyncio.Task[None] | None = None
        self._log = get_logger()
        self.port: int | None = None
        self.app = web.Application(client_max_size=self.config.max_body, middlewares=[_json_errors])
        self.app.router.add_post("/v1/chat/completions", self._chat)
        self.app.router.add_delete("/v1/sessions/{key}", self._end_session)
        self.app.router.add_get("/v1/models", self._models)
        self.app.router.add_get("/metrics", self._metrics)
        self.app.router.add_get("/healthz", self._healthz)
        self._replica = Replica(
            engine,
            name=self.config.replica_id,
            live=lambda: not self._closing,
            retry_after=self.config.stall_retry_after,
            headroom=self.metrics.admission_headroom,
        )
        self._replica.install(self.app)  # X-Metronome-Replica on every response, /readyz
        if self.config.realtime is not None:
            self.app.router.add_get("/v1/realtime", self._realtime)

    # lifecycle -----------------------------------------------------------------------------------

    async def __aenter__(self) -> ChatServer:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def start(self) -> None:
        """Load the model (if the engine has not), then listen."""
        if self.config.realtime is not None:
            # the voice loads (its threads and the piper process) while the engine loads the model
            voice = asyncio.ensure_future(asyncio.to_thread(self._load_voice))
            try:
                await self.engine.start()
            finally:
                await voice
        else:
            await self.engine.start()
        if self.voice_admission is not None and self._probe:  # idle now: the model and the voice are loaded
            await asyncio.to_thread(self._probe_voice, self.voice_admission)
        if self.engine.tokenizer is None:
            raise ValueError("metronome serve needs an engine with a tokenizer (Engine(tokenizer=...))")
        # a client that hangs up cancels its handler, so a dropped stream stops decoding at once
        runner = web.AppRunner(self.app, access_log=None, handle_signals=False, handler_cancellation=True)
        await runner.setup()
        site = web.TCPSite(runner, self.config.host, self.config.port)
        await site.start()
        self._runner = runner
        self.port = runner.addresses[0][1]
        self._reaper = asyncio.ensure_future(self._reap())
        self._log.info("serve.listening", url=self.url, token=self.config.token is not None)

    def _load_voice(self) -> None:
        from ..voice._default import load_voice, load_words  # the [voice] extra, only where /v1/realtime is served

        self._stt, self._tts = load_voice(self._stt, self._tts, self._own_voice)
        self._text_turn = load_words(self._text_turn, wanted=self._probe)  # semantic_vad's, beside the default voice

    def _probe_voice(self, admission: VoiceAdmission) -> None:
        assert self._stt is not None and self._tts is not None
        rest = (self._vad or default_turn_detector)().end_silence + 4 * self.engine.timing.period
        transcribe, synthesize = admission.probe(self._stt, self._tts, rest=rest)
        self._log.info("serve.voice_probe", transcribe=round(transcribe, 3), synthesize=round(synthesize, 3))

    def _observe(self, latency: TurnLatency) -> None:
        if self.voice_admission is not None:
            self.voice_admission.observe_turn(latency, callers=max(1, self._realtime_calls))

    async def _reap(self) -> None:
        period = min(max(self.config.idle_timeout / 4, 0.05), 30.0)
        while True:
            await asyncio.sleep(period)
            closed = await self._registry.reap()
            if closed:
                self.metrics.idle_closed.inc(closed)
                self.metrics.named_sessions.set(len(self._registry))

    @property
    def url(self) -> str:
        host = self.config.host if ":" not in self.config.host else f"[{self.config.host}]"
        return f"http://{host}:{self.port if self.port is not None else self.config.port}/v1"

    @property
    def named_sessions(self) -> int:
        return len(self._registry)

    async def aclose(self) -> None:
        """Interrupt every reply, close every session, stop listening. Idempotent."""
        self._closing = True
        if self._reaper is not None:
            self._reaper.cancel()
            await asyncio.gather(self._reaper, return_exceptions=True)
            self._reaper = None
        for scope in list(self._replies):
            scope.cancel()
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()
        await self._registry.aclose()
        self.metrics.named_sessions.set(0)
        while self._own_voice:
            await asyncio.to_thread(self._own_voice.pop().close)

    # requests ------------------------------------------------------------------------------------

    def _authorized(self, request: web.Request) -> bool:
        return bearer_matches(request.headers.get("Authorization", ""), self.config.token)

    def _refusal(self, request: web.Request, *, json_body: bool) -> web.Response | None:
        def refuse(status: int, code: str, message: str, headers: dict[str, str] | None = None) -> web.Response:
            row = ErrorMapping(code, status, "invalid_request_error", "INVALID_REQUEST", False)
            response = _error_response(row, message)
            response.headers.update(headers or {})
            return response

        if not self._authorized(request):
            return refuse(401, "Unauthorized", "a valid bearer token is required", {"WWW-Authenticate": "Bearer"})
        if json_body and request.content_length is not None and request.content_length > self.config.max_body:
            return refuse(413, "TooLarge", f"the body may hold at most {self.config.max_body} bytes")
        if json_body and request.content_type != "application/json":
            return refuse(415, "UnsupportedMediaType", "send the request as Content-Type: application/json")
        return None

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        response = await self._answer(request)
        self.metrics.requests.labels(str(response.status)).inc()
        return response

    async def _answer(self, request: web.Request) -> web.StreamResponse:
        refused = self._refusal(request, json_body=True)
        if refused is not None:
            return refused
        if self._closing:
            return _error_response(_SHUTTING_DOWN, "the server is shutting down", self.config.stall_retry_after)
        try:
            body = await request.read()
        except web.HTTPRequestEntityTooLarge:
            return self._refusal_too_large()
        try:
            req = oai.parse_request(
                body,
                header_key=request.headers.get(oai.SESSION_HEADER),
                default_max_tokens=self.config.max_tokens,
                max_tokens_limit=self.config.max_tokens_limit,
            )
        except ValueError as exc:
            return self._failure(exc)
        if req.session_key is None:
            return await self._one_off(request, req)
        return await self._named(request, req, req.session_key)

    def _refusal_too_large(self) -> web.Response:
        row = ErrorMapping("TooLarge", 413, "invalid_request_error", "INVALID_REQUEST", False)
        return _error_response(row, f"the body may hold at most {self.config.max_body} bytes")

    def _failure(self, exc: BaseException) -> web.Response:
        row = error_mapping(exc)
        retry = retry_after_seconds(exc, self.config.stall_retry_after) if row.retryable else None
        if row.status >= 500 or row.status == 429:
            self._log.warning("serve.refused", status=row.status, error=row.exception, reason=str(exc)[:200])
        return _error_response(row, str(exc) or row.exception, retry)

    async def _open(self, system_prompt: str | None) -> Conversation:
        session = self.engine.session(
            system_prompt,
            sampling=self._sampling,
            timeout=self.config.admission_wait,
            decode_tokens=self.config.decode_tokens,
        )
        await session.open()
        tokenizer = self.engine.tokenizer
        assert tokenizer is not None  # checked in start()
        return Conversation(session, tokenizer, has_system_prompt=system_prompt is not None)

    async def _one_off(self, request: web.Request, req: oai.ChatRequest) -> web.StreamResponse:
        system, turns = split_system(req.messages)
        try:
            conversation = await self._open(system)
        except Exception as exc:  # AdmissionRejected, a bad prompt, a closed engine
            return self._failure(exc)
        try:
            return await self._respond(request, req, conversation, turns, None)
        finally:
            # in a task of its own: aiohttp cancels a handler whose client left, natively (an anyio
            # shield does not stop that), and a close cut half-way would keep the session's blocks
            await asyncio.shield(conversation.aclose())

    async def _named(self, request: web.Request, req: oai.ChatRequest, key: str) -> web.StreamResponse:
        if self._replica.declines(self._registry.find(key) is not None, req.messages):
            # the balancer walked past the replica that holds it (full, or gone): the next one may
            return _error_response(_NOT_HERE, f"replica {self.config.replica_id} holds no session {key!r}")
        entry = self._registry.entry(key)
        if entry.reply is not None:
            entry.reply.cancel()  # a newer turn on this session: the caller spoke again
        entry.busy = True
        try:
            async with entry.lock:
                conversation = entry.conversation
                if conversation is not None and conversation.session.closed:
                    await self._registry.drop(entry)  # the engine ended it (shed, broken): start afresh
                    entry = self._registry.entry(key)
                    entry.busy = True
                    conversation = None
                if conversation is None:
                    system, turns = split_system(req.messages)
                    try:
                        conversation = await self._open(system)
                    except Exception as exc:
                        return self._failure(exc)
                    entry.conversation, entry.system_prompt = conversation, system
                    self.metrics.named_sessions.set(len(self._registry))
                else:
                    turns = new_turns(req.messages, entry.system_prompt)
                return await self._respond(request, req, conversation, turns, entry)
        finally:
            entry.busy = False
            self._registry.touch(entry)

    async def _end_session(self, request: web.Request) -> web.Response:
        """``DELETE /v1/sessions/{key}``: the call ended; close its session now, not at the idle timeout."""
        refused = self._refusal(request, json_body=False)
        if refused is not None:
            return refused
        entry = self._registry.find(request.match_info["key"])
        if entry is None or entry.conversation is None:
            row = ErrorMapping("SessionNotFound", 404, "invalid_request_error", "INVALID_REQUEST", False)
            return _error_response(row, "no open session has this key")
        if entry.reply is not None:
            entry.reply.cancel()
        async with entry.lock:
            await self._registry.drop(entry)
        self.metrics.named_sessions.set(len(self._registry))
        return web.json_response({"deleted": True})

    async def _realtime(self, request: web.Request) -> web.StreamResponse:
        """``GET /v1/realtime``: refused before the upgrade (401, 426, 429/503), else one session's WebSocket."""
        self.metrics.realtime_open.inc()
        self._realtime_calls += 1
        try:
            response = await self._realtime_connection(request)
        finally:
            self._realtime_calls -= 1
            self.metrics.realtime_open.dec()
        self.metrics.realtime_answers.labels(str(response.status)).inc()  # 101: upgraded, served and ended
        return response

    async def _realtime_connection(self, request: web.Request) -> web.StreamResponse:
        refused = self._refusal(request, json_body=False)
        if refused is not None:
            return refused
        realtime = self.config.realtime
        assert realtime is not None and self._stt is not None and self._tts is not None  # the route needs them
        if self._closing:
            return _error_response(_SHUTTING_DOWN, "the server is shutting down", self.config.stall_retry_after)
        if not web.WebSocketResponse().can_prepare(request).ok:
            row = ErrorMapping("UpgradeRequired", 426, "invalid_request_error", "INVALID_REQUEST", False)
            return _error_response(row, "/v1/realtime is a WebSocket: connect with an Upgrade: websocket request")
        try:
            if self.voice_admission is not None:  # the connections already open, this one not counted
                self.voice_admission.admit(self._realtime_calls - 1)
            session = self.engine.try_session(realtime.instructions, decode_tokens=realtime.decode_tokens)
        except Exception as exc:  # AdmissionRejected (429 + Retry-After), a closed engine (503)
            return self._failure(exc)
        return await serve_realtime(
            request,
            self.engine,
            session,
            config=realtime,
            model=request.query.get("model") or self.config.model,
            stt=self._stt,
            tts=self._tts,
            vad=self._vad or default_turn_detector,
            on_latency=self._observe,
            text_turn=self._text_turn,
        )

    # replies ---------------------------------------------------------------------------------------

    async def _respond(
        self,
        request: web.Request,
        req: oai.ChatRequest,
        conversation: Conversation,
        turns: Sequence[Mapping[str, str]],
        entry: Named | None,
    ) -> web.StreamResponse:
        scope = anyio.CancelScope()
        self._replies.add(scope)
        if entry is not None:
            entry.reply = scope
        pieces = conversation.reply(turns, max_tokens=req.max_tokens)
        try:
            if req.stream:
                return await self._stream(request, req, pieces, scope, conversation.session)
            response = await self._complete(req, pieces, scope)
            if response.status == 200:
                response.headers.update(oai.context_headers(conversation.session.stats()))
            return response
        finally:
            await pieces.aclose()
            self._replies.discard(scope)
            if entry is not None and entry.reply is scope:
                entry.reply = None

    def _interrupted(self) -> tuple[ErrorMapping, str]:
        self.metrics.interrupted.inc()
        if self._closing:
            return _SHUTTING_DOWN, "the server is shutting down; the reply was cut"
        return _INTERRUPTED, "a newer request on this session interrupted the reply"

    def _interrupted_response(self) -> web.Response:
        row, message = self._interrupted()
        return _error_response(row, message, self.config.stall_retry_after if row.retryable else None)

    async def _complete(
        self, req: oai.ChatRequest, pieces: AsyncGenerator[ReplyPiece, None], scope: anyio.CancelScope
    ) -> web.Response:
        parts: list[str] = []
        stopped = False
        count = 0
        with scope:  # cancelled by a newer request on the session, or by shutdown
            try:
                async for piece in pieces:
                    parts.append(piece.text)
                    count += piece.tokens
                    stopped = piece.stop
            except Exception as exc:
                return self._failure(exc)
        if scope.cancelled_caught:
            return self._interrupted_response()
        body = oai.completion(
            id=oai.new_id(),
            model=self.config.model,
            text="".join(parts),
            finish_reason="stop" if stopped else "length",
            prompt_tokens=0,
            completion_tokens=count,
        )
        return web.json_response(body)

    async def _stream(
        self,
        request: web.Request,
        req: oai.ChatRequest,
        pieces: AsyncGenerator[ReplyPiece, None],
        scope: anyio.CancelScope,
        session: Session,
    ) -> web.StreamResponse:
        response: web.StreamResponse | None = None
        ident, created = oai.new_id(), int(time.time())

        async def send(obj: Mapping[str, Any] | str) -> None:
            assert response is not None
            data = obj if isinstance(obj, str) else json.dumps(obj, separators=(",", ":"))
            await response.write(f"data: {data}\n\n".encode())

        def chunk(delta: dict[str, str], finish: str | None = None) -> dict[str, Any]:
            return oai.stream_chunk(
                id=ident, model=self.config.model, created=created, delta=delta, finish_reason=finish
            )

        count = 0
        piece: ReplyPiece | None = None
        with scope:  # cancelled by a newer request on the session, or by shutdown
            try:
                # the first token decides the status: a failure before it is an HTTP error a client can retry
                piece = await pieces.__anext__()
            except Exception as exc:
                return self._failure(exc)
            response = web.StreamResponse(
                headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "x-should-retry": "false"}
            )
            await response.prepare(request)
            await send(chunk({"role": "assistant", "content": ""}))
            try:
                while True:
                    count += piece.tokens
                    if piece.text:
                        await send(chunk({"content": piece.text}))
                    if piece.stop:
                        break
                    piece = await pieces.__anext__()
            except StopAsyncIteration:
                pass  # max_tokens reached
            except ConnectionResetError:
                return response  # the client left: closing the reply cuts it (the context keeps what was sent)
            except Exception as exc:
                row = error_mapping(exc)
                self.metrics.stream_errors.labels(row.exception).inc()
                self._log.warning("serve.stream_failed", error=row.exception, after_tokens=count)
                await send(oai.error_body(row, str(exc) or row.exception))
                return response
        if scope.cancelled_caught:
            if response is None:
                return self._interrupted_response()
            row, message = self._interrupted()
            await send(oai.error_body(row, message))
            return response
        assert response is not None and piece is not None
        # the last chunk also says what the model still sees (the non-streamed reply's headers)
        await send({**chunk({}, "stop" if piece.stop else "length"), **oai.context_field(session.stats())})
        if req.include_usage:
            await send({**chunk({}), "choices": [], "usage": oai.usage(0, count)})
        await send("[DONE]")
        return response

    # observability -----------------------------------------------------------------------------------

    async def _models(self, request: web.Request) -> web.Response:
        refused = self._refusal(request, json_body=False)
        if refused is not None:
            return refused
        model = {"id": self.config.model, "object": "model", "created": 0, "owned_by": "metronome"}
        return web.json_response({"object": "list", "data": [model]})

    async def _metrics(self, request: web.Request) -> web.Response:
        refused = self._refusal(request, json_body=False)
        if refused is not None:
            return refused
        self.metrics.named_sessions.set(len(self._registry))
        body = self._replica.exposition([self.engine.metrics.registry, self.metrics.registry])
        return web.Response(body=body, content_type="text/plain", charset="utf-8")

    async def _healthz(self, request: web.Request) -> web.Response:
        stats = self.engine.stats()
        healthy = not self.engine.closed and self.engine.failure is None and not self._closing
        return web.json_response(
            {
                "status": "ok" if healthy else "unavailable",
                "sessions": stats.sessions,
                "named_sessions": len(self._registry),
                "limit": stats.limit,
                "used_blocks": stats.used_blocks,
                "pool_blocks": stats.pool_blocks,
            },
            status=200 if healthy else 503,
        )

    def __repr__(self) -> str:
        state = "listening" if self._runner is not None else "stopped"
        return f"ChatServer({self.url}, named_sessions={len(self._registry)}, {state})"
