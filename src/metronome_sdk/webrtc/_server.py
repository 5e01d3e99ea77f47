"""The signaling server (aiohttp): ``POST /offer`` opens a session per peer; ``/`` serves the demo page.

Bad input is answered with a status and a JSON reason, never a 500 or a traceback:
401 for a missing or wrong bearer token, 413 for an oversized body, 415 for a body that
is not sent as ``application/json``, 400 for a body that is not an offer or an SDP that
cannot be served, 429 with ``Retry-After`` when one client address sends too many offers,
503 with ``Retry-After`` when the peer cap is reached or admission refuses the session.
Cross-origin requests are refused unless ``ServerConfig.allow_origins`` names the origin.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections import deque
from collections.abc import Awaitable, Callable
from importlib import resources
from types import TracebackType

from aiohttp import web

from .._bearer import bearer_matches
from .._engine import Engine
from .._exceptions import AdmissionRejected, EngineClosed, MetronomeError, Overloaded, SessionBroken, SessionClosed
from .._log import get_logger
from .._session import Session
from ..transports._base import Transport
from ..voice._admission import WEBRTC_UNSEEN, VoiceAdmission
from ..voice._agent import TurnLatency, VoiceAgent, error_event
from ..voice._default import load_voice, load_words
from ..voice._piper import PiperTTS
from ..voice._protocols import SpeechToText, TextToSpeech
from ..voice._text_turn import TextTurnModel
from ..voice._turn import SmartTurn
from ..voice._vad import VoiceActivityDetector, default_turn_detector
from ._config import ServerConfig
from ._peer import WebRTCPeer
from ._replies import json_errors, parse_offer, refuse, retry_after_header, short_reason

__all__ = ["PeerHandler", "ServerConfig", "WebRTCServer"]

PeerHandler = Callable[[Session, Transport], Awaitable[None]]

# the default agent hears the microphone in 20 ms frames: a barge-in is heard a frame after it is spoken
_AGENT_FRAME_SECONDS = 0.02


class WebRTCServer:
    """Serves one ``Session`` per WebRTC peer from ``engine``.

    Each peer's session is handed with its ``WebRTCPeer`` to ``handler``; the default
    handler is a ``VoiceAgent`` with ``stt`` and ``tts`` (by default Whisper tiny.en and Piper's
    joe voice, from the ``[voice]`` extra) and a turn detector from ``vad`` (a factory called
    once per peer; by default ``default_turn_detector``); its callers are admitted on
    ``config.voice_objective`` too (``voice_admission``, a ``VoiceAdmission``; the default
    voice is timed on one question at start-up, a voice given here by the turns it answers),
    before the engine's admission is asked. With ``config.text_turn`` the agent also ends a turn at
    a short pause when ``text_turn`` reads the words so far as finished (by default ``TextTurn``,
    loaded with the default voice; with a voice of your own, give one, or only the silence ends turns).
    When the handler returns or
    fails, or the peer hangs up or vanishes, the peer connection and the session are
    closed and the session's blocks go back to the pool. ``async with`` starts and stops
    it; stopping closes every peer connection. ``app`` is the aiohttp application, for
    mounting it elsewhere.
    """

    def __init__(
        self,
        engine: Engine,
        config: ServerConfig | None = None,
        *,
        stt: SpeechToText | None = None,
        tts: TextToSpeech | None = None,
        handler: PeerHandler | None = None,
        vad: Callable[[], VoiceActivityDetector] | None = None,
        text_turn: TextTurnModel | None = None,
    ) -> None:
        if not isinstance(engine, Engine):
            raise ValueError(f"engine must be a metronome Engine, got {type(engine).__name__}")
        if text_turn is not None and not isinstance(text_turn, TextTurnModel):
            raise ValueError(f"text_turn must have finished(text), got {text_turn!r}")
        if handler is not None and (stt is not None or tts is not None):
            raise ValueError("give a handler, or stt and tts for the default voice agent, not both")
        self.engine = engine
        self.config = config or ServerConfig()
        self._stt = stt
        self._tts = tts
        self._handler = handler
        self._vad = vad or functools.partial(default_turn_detector, self.config.end_silence)
        # the voice is timed at start-up only where the server loads it: a voice of the caller's
        # choosing is not called before a caller speaks, and the first turns calibrate instead
        self._probe = stt is None and tts is None
        self.voice_admission: VoiceAdmission | None = None
        if handler is None and self.config.voice_objective is not None:
            self.voice_admission = VoiceAdmission(
                self.config.voice_objective, unseen=WEBRTC_UNSEEN, retry_after=self.config.busy_retry_after
            )
        self._turn_model: SmartTurn | None = None
        self._text_turn = text_turn
        self._own_voice: list[PiperTTS] = []  # the voices this server started, and stops
        self._log = get_logger()
        self._peers: dict[WebRTCPeer, asyncio.Task[None]] = {}
        self._opening = 0
        self._closing = False
        self._runner: web.AppRunner | None = None
        self._offers: dict[str, deque[float]] = {}  # client address -> times of its offers in the window
        self.port: int | None = None
        self.app = web.Application(client_max_size=self.config.max_body, middlewares=[json_errors])
        self.app.router.add_post("/offer", self._offer)
        self.app.router.add_route("OPTIONS", "/offer", self._preflight)
        self.app.on_response_prepare.append(self._cors_headers)
        if self.config.demo_page:
            self.app.router.add_get("/", self._page("index.html", "text/html"))
            self.app.router.add_get("/client.js", self._page("client.js", "application/javascript"))
        self.app.on_shutdown.append(self._on_shutdown)

    # lifecycle -----------------------------------------------------------------------------------

    async def __aenter__(self) -> WebRTCServer:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    async def start(self) -> None:
        """Load the model (if the engine has not) and the voice, then listen."""
        # the voice loads (its own threads and the piper process) while the engine loads the model
        voice = asyncio.ensure_future(asyncio.to_thread(self._load_voice)) if self._handler is None else None
        try:
            try:
                await self.engine.start()
            finally:
                if voice is not None:
                    await voice
            if self.voice_admission is not None and self._probe:  # idle now: the model and the voice are loaded
                await asyncio.to_thread(self._probe_voice, self.voice_admission)
            await self._listen()
        except BaseException:
            await self._close_voice()  # no aclose() follows a failed start
            raise

    async def _listen(self) -> None:
        runner = web.AppRunner(self.app, access_log=None, handle_signals=False)
        await runner.setup()
        site = web.TCPSite(runner, self.config.host, self.config.port)
        try:
            await site.start()
        except BaseException:
            await runner.cleanup()
            raise
        self._runner = runner
        self.port = runner.addresses[0][1]
        self._log.info("webrtc.listening", url=self.url, token=self.config.token is not None)

    def _load_voice(self) -> None:
        self._stt, self._tts = load_voice(
            self._stt,
            self._tts,
            self._own_voice,
            whisper_window=self.config.whisper_window,
            whisper_workers=self.config.whisper_workers,
        )
        if self.config.smart_turn and self._turn_model is None:
            model = SmartTurn()
            model.load()
            self._turn_model = model
        self._text_turn = load_words(self._text_turn, wanted=self._probe and self.config.reads_words)

    def _probe_voice(self, admission: VoiceAdmission) -> None:
        assert self._stt is not None and self._tts is not None
        # the rest's prior: the turn detector's pause and a few ticks of the engine, until turns say
        rest = self._vad().end_silence + 4 * self.engine.timing.period
        transcribe, synthesize = admission.probe(self._stt, self._tts, rest=rest)
        self._log.info("webrtc.voice_probe", transcribe=round(transcribe, 3), synthesize=round(synthesize, 3))

    @property
    def url(self) -> str:
        host = self.config.host if ":" not in self.config.host else f"[{self.config.host}]"
        return f"http://{host}:{self.port if self.port is not None else self.config.port}/"

    @property
    def addresses(self) -> list[tuple[str, int]]:
        """The (host, port) of each socket the server listens on (empty when it is not listening):
        what ``host`` bound, which ``url`` does not show when a name resolves to several."""
        if self._runner is None:
            return []
        return [(str(address[0]), int(address[1])) for address in self._runner.addresses]

    @property
    def peers(self) -> int:
        return len(self._peers)

    @property
    def _callers(self) -> int:
        return sum(not peer.gone for peer in self._peers)

    async def aclose(self) -> None:
        """Tell every peer the server is going, close their connections and sessions, stop listening."""
        await self._on_shutdown(self.app)
        if self._runner is not None:
            runner, self._runner = self._runner, None
            await runner.cleanup()
        await self._close_voice()

    async def _close_voice(self) -> None:
        while self._own_voice:
            await asyncio.to_thread(self._own_voice.pop().close)

    async def _on_shutdown(self, app: web.Application) -> None:
        self._closing = True
        peers = list(self._peers.items())
        for peer, _ in peers:
            await peer.send_event({"type": "closed", "reason": "server_shutdown"})
        for _, task in peers:
            task.cancel()
        await asyncio.gather(*(task for _, task in peers), return_exceptions=True)

    # requests ------------------------------------------------------------------------------------

    def _page(self, name: str, content_type: str) -> Callable[[web.Request], Awaitable[web.Response]]:
        body = resources.files(__package__).joinpath("static", name).read_bytes()

        async def serve(request: web.Request) -> web.Response:
            return web.Response(body=body, content_type=content_type, headers={"Cache-Control": "no-store"})

        return serve

    def _allowed_origin(self, request: web.Request) -> str | None:
        origin = request.headers.get("Origin")
        return origin if origin is not None and origin in self.config.allow_origins else None

    async def _cors_headers(self, request: web.Request, response: web.StreamResponse) -> None:
        origin = self._allowed_origin(request)
        if origin is not None:
            response.headers["Access-Control-Allow-Origin"] = origin
            response.headers["Vary"] = "Origin"
            response.headers["Access-Control-Expose-Headers"] = "Retry-After"

    async def _preflight(self, request: web.Request) -> web.Response:
        if self._allowed_origin(request) is None:
            return refuse(403, "origin_not_allowed", "cross-origin requests are refused (see allow_origins)")
        return web.Response(
            status=204,
            headers={
                "Access-Control-Allow-Methods": "POST",
                "Access-Control-Allow-Headers": "Authorization, Content-Type",
                "Access-Control-Max-Age": "600",
            },
        )

    def _authorized(self, request: web.Request) -> bool:
        return bearer_matches(request.headers.get("Authorization", ""), self.config.token)

    def _rate_limited(self, request: web.Request) -> float | None:
        """Count this offer against its client address; the seconds to wait if over the limit."""
        now = time.monotonic()
        window = self.config.offer_window
        if len(self._offers) > 4096:  # many addresses: forget the ones that have gone quiet
            for address in [a for a, times in self._offers.items() if not times or times[-1] <= now - window]:
                del self._offers[address]
        times = self._offers.setdefault(request.remote or "unknown", deque())
        while times and times[0] <= now - window:
            times.popleft()
        if len(times) >= self.config.offers_per_client:
            return times[0] + window - now
        times.append(now)
        return None

    async def _offer(self, request: web.Request) -> web.Response:
        wait = self._rate_limited(request)
        if wait is not None:
            self._log.warning("webrtc.client_rate_limited", limit=self.config.offers_per_client)
            return refuse(
                429,
                "too_many_offers",
                f"at most {self.config.offers_per_client} offers per {self.config.offer_window:g} s from one address",
                retry_after_header(wait),
            )
        if not self._authorized(request):
            return refuse(401, "unauthorized", "a valid bearer token is required", {"WWW-Authenticate": "Bearer"})
        if request.content_length is not None and request.content_length > self.config.max_body:
            return refuse(413, "too_large", f"the body may hold at most {self.config.max_body} bytes")
        if request.content_type != "application/json":
            # also what makes a cross-origin page's POST need a preflight, which is refused by default
            return refuse(415, "unsupported_media_type", "send the offer as Content-Type: application/json")
        if self._closing:
            return refuse(
                503, "shutting_down", "the server is shutting down", retry_after_header(self.config.busy_retry_after)
            )
        if len(self._peers) + self._opening >= self.config.max_peers:
            self._log.warning("webrtc.peer_cap", peers=len(self._peers), max_peers=self.config.max_peers)
            return refuse(
                503,
                "too_many_peers",
                f"{self.config.max_peers} peers are connected, the most this server takes; retry later",
                retry_after_header(self.config.busy_retry_after),
            )
        self._opening += 1
        try:
            return await self._open_peer(request)
        finally:
            self._opening -= 1

    async def _open_peer(self, request: web.Request) -> web.Response:
        offer = parse_offer(await request.read())
        if isinstance(offer, web.Response):
            return offer
        if self.voice_admission is not None:
            try:  # the callers still on the line (one hanging up is not), this one not counted
                self.voice_admission.admit(self._callers + self._opening - 1)
            except AdmissionRejected as exc:
                return refuse(503, "voice_objective", str(exc), retry_after_header(exc.retry_after))
        try:
            rewind = self.config.rewind_tokens if self._handler is None else 0  # a handler's sessions take no marks
            session = self.engine.try_session(self.config.system_prompt, rewind_tokens=rewind)
        except Overloaded as exc:
            return refuse(503, "admission_rejected", str(exc), retry_after_header(exc.retry_after))
        except (EngineClosed, SessionClosed) as exc:
            return refuse(503, "engine_closed", str(exc), retry_after_header(self.config.busy_retry_after))
        peer = WebRTCPeer(
            media_timeout=self.config.media_timeout,
            max_buffered=self.config.max_buffered,
            session_id=session.id,
            frame_seconds=0.08 if self._handler is not None else _AGENT_FRAME_SECONDS,
            reply_lead=self.config.reply_lead,
        )
        try:
            answer = await peer.accept(offer)
        except asyncio.CancelledError:
            await peer.aclose()
            await session.aclose()
            raise
        except Exception as exc:  # what aiortc raises for an offer it cannot take (ValueError, KeyError...)
            self._log.info("webrtc.bad_offer", error=repr(exc))
            try:
                await peer.aclose()
            except Exception:  # aiortc may fail to close a connection its bad offer left half-built
                self._log.info("webrtc.bad_offer_close_failed", exc_info=True)
            finally:
                await session.aclose()
            return refuse(400, "bad_offer", f"the offer cannot be served: {short_reason(exc)}")
        self._peers[peer] = asyncio.ensure_future(self._serve(peer, session))
        self._log.info("webrtc.peer_opened", session_id=session.id, peers=len(self._peers))
        return web.json_response({"sdp": answer.sdp, "type": answer.type})

    async def _serve(self, peer: WebRTCPeer, session: Session) -> None:
        try:
            if self._handler is not None:
                await self._handler(session, peer)
            else:
                assert self._stt is not None and self._tts is not None
                agent = VoiceAgent(
                    session,
                    peer,
                    stt=self._stt,
                    tts=self._tts,
                    vad=self._vad(),
                    on_latency=self._observe,
                    turn_model=self._turn_model,
                    text_turn=self._text_turn if self.config.reads_words else None,
                    **self.config.agent_options(),
                )
                await agent.run()
        except MetronomeError as exc:
            reason = getattr(exc, "reason", None)
            self._log.warning("webrtc.session_failed", session_id=session.id, error=type(exc).__name__, reason=reason)
            if not isinstance(exc, SessionBroken):  # a handler of the user's may not have said so (the agent has)
                await peer.send_event(error_event(exc))
                await peer.send_event({"type": "closed", "reason": type(exc).__name__})
        except asyncio.CancelledError:
            pass  # the server is shutting down
        except Exception as exc:  # a bug in the handler: the peer still hears of it
            self._log.exception("webrtc.handler_failed", session_id=session.id)
            await peer.send_event(error_event(exc))
            await peer.send_event({"type": "closed", "reason": "internal_error"})
        finally:
            await asyncio.shield(self._release(peer, session))

    def _observe(self, latency: TurnLatency) -> None:
        if self.voice_admission is not None:
            self.voice_admission.observe_turn(latency, callers=max(1, self._callers))

    async def _release(self, peer: WebRTCPeer, session: Session) -> None:
        await peer.aclose()
        await session.aclose()
        self._peers.pop(peer, None)
        self._log.info("webrtc.peer_closed", session_id=session.id, peers=len(self._peers), ended_by=peer.ended_by)

    def __repr__(self) -> str:
        state = "listening" if self._runner is not None else "stopped"
        return f"WebRTCServer({self.url}, peers={len(self._peers)}, {state})"
