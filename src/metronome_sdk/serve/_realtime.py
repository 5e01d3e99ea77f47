"""``/v1/realtime``: one OpenAI Realtime WebSocket is one ``Session``, answered by the demo's ``VoiceAgent``.

``RealtimeTransport`` is the agent's ``Transport`` (and ``Playback``): it reads the client's
events, hands appended audio to the agent as 20 ms microphone frames at the turn detector's
rate, turns the agent's events (turn heard, transcript, reply text, interrupted, error) into
the API's server events, and sends the agent's speech as ``response.output_audio.delta``
events paced ``audio_lead`` seconds ahead of real time, so that a ``response.cancel`` or a
barge-in cuts the audio not yet sent. The voice turn itself (turn detection, transcription,
first clause spoken while the rest decodes, barge-in) is the agent's, the same as over WebRTC.

Turn detection ``server_vad`` / ``semantic_vad``: the agent's detector ends turns and each
is answered; ``semantic_vad`` also asks the words model (``TextTurn``) at each short pause
and ends the turn there when the words so far read as finished, else after
``semantic_silence``. ``null``: appended audio waits in a buffer; ``input_audio_buffer.commit`` makes
it a user item and ``response.create`` answers it (or the typed items since the last reply).
The session opens before the upgrade (a refusal is an HTTP 429 or 503); the agent starts at
the first audio or ``response.create``, and until then a ``session.update`` may change the
pinned instructions (the session is reopened with them; after that they are fixed).

Why this module is past 400 lines: it is one connection's protocol state machine, whose
client events, agent events and paced audio share one response in flight; the pure wire
format is ``_realtime_protocol.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc
import numpy as np
import numpy.typing as npt
from aiohttp import WSMsgType, web

from .._audio import Framer, resample
from .._engine import Engine
from .._exceptions import MetronomeError, Overloaded, SessionBroken
from .._frames import InputFrame
from .._log import get_logger
from .._session import Session
from ..transports._base import Event
from ..voice._agent import TurnLatency, VoiceAgent
from ..voice._protocols import SpeechToText, TextToSpeech
from ..voice._text_turn import TextTurnModel
from ..voice._vad import VoiceActivityDetector
from . import _realtime_protocol as rt
from ._config import RealtimeConfig

__all__ = ["RealtimeTransport"]

_FRAME_SECONDS = 0.02  # the agent hears 20 ms frames, as over WebRTC: a barge-in is heard a frame after it is spoken
_CHUNK = rt.RATE // 10  # reply audio goes out in 100 ms deltas
_CLOSE_OVERLOADED = 1013  # WebSocket "try again later"
_CLOSE_FAILED = 1011
_SERVER_PAUSE = 0.2  # server_vad: the pause at which the turn's transcript starts (VoiceAgent's default)
_SEMANTIC_PAUSE = 0.1  # semantic_vad: the words model decides at it, as in the WebRTC demo


@dataclass(eq=False)
class _Response:
    id: str
    output: str  # "audio" or "text"
    user_item: str | None
    item_id: str = field(default_factory=lambda: rt.new_id("item"))
    started: bool = False  # its item and content part were announced
    text: list[str] = field(default_factory=list)
    decoded: bool = False  # the agent's final transcript came: no more text
    transcribed: bool = False  # its user item's transcript was sent
    heard_seconds: float = 0.0  # the user's speech it answers
    cancelled: str | None = None  # why: "client_cancelled", "turn_detected"
    audio_sent: int = 0  # samples at 24 kHz
    first_audio_at: float = math.nan
    metadata: object = None  # response.create's, sent back (clients match their request by it)


@dataclass(eq=False)
class _Pending:
    """A user turn handed to the agent, waiting for its ``thinking`` event."""

    item_id: str
    audio: bool
    committed: bool  # input_audio_buffer.committed was sent for it
    seconds: float = 0.0  # of speech, for the transcription's usage


class RealtimeTransport:
    """One Realtime connection: the client's WebSocket on one side, a ``VoiceAgent`` on the other.

    ``run()`` serves the connection until the client closes it (or stops reading for
    ``config.send_timeout``, or the session fails); the caller closes ``session`` after it.
    """

    def __init__(
        self,
        ws: web.WebSocketResponse,
        request: web.Request,
        engine: Engine,
        session: Session,
        *,
        config: RealtimeConfig,
        model: str,
        stt: SpeechToText,
        tts: TextToSpeech,
        vad: Callable[[], VoiceActivityDetector],
        on_latency: Callable[[TurnLatency], None] | None = None,
        text_turn: TextTurnModel | None = None,
    ) -> None:
        self.ws = ws
        self._text_turn = text_turn
        self._on_latency = on_latency
        self.engine = engine
        self.session = session
        self.config = config
        self.model = model
        self.settings = rt.SessionSettings(instructions=config.instructions)
        self.gone = False  # the client left: VoiceAgent reads it, so that nobody waits to play to it
        self._request = request
        self._stt, self._tts = stt, tts
        self.vad = vad()
        # server_vad's silence; semantic_vad waits longer for what the words left open
        self._server_silence = self.vad.end_silence
        self._id = rt.new_id("sess")
        self._log = get_logger(session_id=session.id)
        self._agent: VoiceAgent | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._mic_in, self._mic_out = anyio.create_memory_object_stream[InputFrame](
            math.ceil(config.max_buffer_seconds / _FRAME_SECONDS)
        )
        self._framer = Framer(round(self.vad.sample_rate * _FRAME_SECONDS))
        self._buffer: list[npt.NDArray[np.int16]] = []  # push-to-talk audio at the detector's rate
        self._buffered = 0
        self._received = 0  # samples at 24 kHz appended in all, for audio_start_ms / audio_end_ms
        self._speech_item: str | None = None  # the item the speech under way will become
        self._speech_start_ms = 0  # where in the appended audio it started
        self._committed: list[npt.NDArray[np.int16]] = []  # push-to-talk turns committed, not yet answered
        self._committed_item: str | None = None
        self._texts: list[tuple[str, str]] = []  # typed user items since the last reply
        self._pending: deque[_Pending] = deque()
        self._response: _Response | None = None
        self._next_output: str | None = None  # response.create's output_modalities for the next response
        self._next_metadata: object = None  # and its metadata
        self._audio: deque[tuple[_Response, npt.NDArray[np.int16]]] = deque()  # reply audio at 24 kHz, unsent
        self._wake = anyio.Event()
        self._send_lock = anyio.Lock()
        # held while a response ends, from `_response = None` to its response.done: the next
        # response.created waits for it, so a client never sees a response begin before the last one is done
        self._ending = anyio.Lock()
        self.failure: BaseException | None = None

    # serving --------------------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            await self._send(rt.server_event("session.created", session=self._session_object()))
            await self._send_rate_limits()
            async with anyio.create_task_group() as tg:
                self._tg = tg
                tg.start_soon(self._pace_audio)
                await self._read()
                self.gone = True
                tg.cancel_scope.cancel()
        finally:
            self.gone = True
            self._mic_in.close()
            self._mic_out.close()

    async def _read(self) -> None:
        with contextlib.suppress(SessionBroken):  # the client stopped reading: it was cut off (_send)
            await self._read_events()

    async def _read_events(self) -> None:
        async for msg in self.ws:
            if msg.type == WSMsgType.TEXT:
                try:
                    await self._handle(rt.parse_event(msg.data, max_chars=self.config.max_message_bytes))
                except rt.RealtimeProtocolError as exc:
                    self._log.info("realtime.bad_event", code=exc.code)
                    await self._send(rt.protocol_error_event(exc))
            elif msg.type == WSMsgType.BINARY:
                await self._send(rt.error_event("invalid_event", "events are JSON text messages, not binary"))
            else:  # an error (a message past max_message_bytes: aiohttp closes with 1009)
                self._log.info("realtime.socket_error", error=repr(self.ws.exception()))
                break
            if self.failure is not None:
                break

    async def _handle(self, event: dict[str, Any]) -> None:
        kind = event["type"]
        event_id = event.get("event_id") if isinstance(event.get("event_id"), str) else None
        if kind == "session.update":
            await self._session_update(event.get("session"), event_id)
        elif kind == "input_audio_buffer.append":
            await self._append(event.get("audio"), event_id)
        elif kind == "input_audio_buffer.commit":
            await self._commit(event_id)
        elif kind == "input_audio_buffer.clear":
            self._clear_input()
            await self._send(rt.server_event("input_audio_buffer.cleared"))
        elif kind == "conversation.item.create":
            item_id, text = rt.user_text(event)
            self._texts.append((item_id, text))
            item = rt.message_item(item_id, "user", [{"type": "input_text", "text": text}])
            previous = event.get("previous_item_id") if isinstance(event.get("previous_item_id"), str) else None
            await self._send(rt.server_event("conversation.item.added", previous_item_id=previous, item=item))
            await self._send(rt.server_event("conversation.item.done", previous_item_id=previous, item=item))
        elif kind == "conversation.item.truncate":
            await self._truncate(event, event_id)
        elif kind == "response.create":
            await self._response_create(event.get("response"), event_id)
        elif kind in ("response.cancel", "output_audio_buffer.clear"):
            await self._cancel(event_id, quiet=kind == "output_audio_buffer.clear")
        else:  # conversation.item.delete / retrieve
            raise rt.RealtimeProtocolError(
                "unsupported_event",
                f"{kind} is not supported: the session's context is its bounded window, not an editable list",
                param="type",
                event_id=event_id,
            )

    # client events --------------------------------------------------------------------------------

    async def _session_update(self, session: object, event_id: str | None) -> None:
        settings = self.settings.update(session, event_id=event_id)
        if settings.instructions != self.settings.instructions:
            if self._agent is not None:
                raise rt.RealtimeProtocolError(
                    "instructions_locked",
                    "the instructions are pinned once the conversation has begun; open a new connection to change them",
                    param="session.instructions",
                    event_id=event_id,
                )
            if not await self._reopen(settings.instructions):
                return
        if settings.turn_detection != self.settings.turn_detection:
            self._clear_input()
        self.settings = settings
        self._listen_by_words()
        if self._agent is not None:
            self._agent.barge_in = 0.06 if settings.interrupt_response else None
            self._agent.max_reply_tokens = self._reply_tokens()
        await self._send(rt.server_event("session.updated", session=self._session_object()))

    async def _reopen(self, instructions: str) -> bool:
        """The pinned prompt is prefilled at open: other instructions need another session (none has spoken).

        It takes the place this one frees, unless another caller took it first: then the client
        gets the admission error and the connection closes.
        """
        await self.session.aclose()
        try:
            self.session = self.engine.try_session(instructions, decode_tokens=self.config.decode_tokens)
        except Exception as exc:  # AdmissionRejected (another caller took the place), CacheExhausted, ValueError
            self.failure = exc
            await self._fail(exc)
            return False
        self._log = get_logger(session_id=self.session.id)
        return True

    async def _append(self, audio: object, event_id: str | None) -> None:
        pcm24 = rt.decode_audio(audio, max_bytes=self.config.max_append_bytes, event_id=event_id)
        if pcm24.size == 0:
            return
        self._received += pcm24.size
        pcm = resample(pcm24, rt.RATE, self.vad.sample_rate)
        if self.settings.turn_detection is None:
            if self._buffered + pcm.size > self.config.max_buffer_seconds * self.vad.sample_rate:
                raise rt.RealtimeProtocolError(
                    "input_audio_buffer_full",
                    f"the input buffer holds at most {self.config.max_buffer_seconds:g} s without turn detection: "
                    "commit or clear it",
                    event_id=event_id,
                )
            self._buffer.append(pcm)
            self._buffered += pcm.size
            return
        self._start_agent()
        for frame in self._framer.push(pcm):
            try:
                self._mic_in.send_nowait(InputFrame.from_audio(frame, sample_rate=self.vad.sample_rate))
            except anyio.WouldBlock:
                raise rt.RealtimeProtocolError(
                    "input_audio_buffer_full",
                    "audio arrives faster than it is heard; send it in real time",
                    event_id=event_id,
                ) from None

    async def _commit(self, event_id: str | None) -> None:
        previous = self._last_item()
        if self.settings.turn_detection is None:
            if not self._buffered:
                raise rt.RealtimeProtocolError(
                    "input_audio_buffer_commit_empty", "the input audio buffer is empty", event_id=event_id
                )
            item_id = rt.new_id("item")
            self._committed.append(np.concatenate(self._buffer))
            self._committed_item = item_id
            self._buffer, self._buffered = [], 0
            await self._send_committed(item_id, previous)
            return
        agent = self._start_agent()
        item_id = self._speech_item or rt.new_id("item")
        if not agent.end_turn():
            raise rt.RealtimeProtocolError(
                "input_audio_buffer_commit_empty", "no speech was heard since the last turn", event_id=event_id
            )
        self._speech_item = None
        self._pending.append(_Pending(item_id, audio=True, committed=True, seconds=self._speech_seconds()))
        await self._send_committed(item_id, previous)

    def _last_item(self) -> str | None:
        return self._texts[-1][0] if self._texts else None

    async def _send_committed(self, item_id: str, previous: str | None) -> None:
        await self._send(rt.server_event("input_audio_buffer.committed", item_id=item_id, previous_item_id=previous))
        item = rt.message_item(item_id, "user", [{"type": "input_audio", "transcript": None}], status="in_progress")
        await self._send(rt.server_event("conversation.item.added", previous_item_id=previous, item=item))

    def _clear_input(self) -> None:
        self._buffer, self._buffered = [], 0
        self._speech_item = None
        self.vad.reset()
        while True:
            try:
                self._mic_out.receive_nowait()
            except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                break

    async def _truncate(self, event: dict[str, Any], event_id: str | None) -> None:
        """The client stopped playing a reply: the context already kept only what was decoded before the cut."""
        item_id = event.get("item_id")
        end = event.get("audio_end_ms")
        if not isinstance(item_id, str) or not isinstance(end, int) or isinstance(end, bool) or end < 0:
            raise rt.RealtimeProtocolError(
                "invalid_value", "truncate needs item_id and audio_end_ms >= 0", event_id=event_id
            )
        await self._send(
            rt.server_event(
                "conversation.item.truncated",
                item_id=item_id,
                content_index=event.get("content_index", 0),
                audio_end_ms=end,
            )
        )

    async def _response_create(self, params: object, event_id: str | None) -> None:
        if self._response is not None or self._pending:
            raise rt.RealtimeProtocolError(
                "conversation_already_has_active_response",
                "a response is in progress; cancel it or wait for response.done",
                event_id=event_id,
            )
        params = params if isinstance(params, dict) else {}
        modalities = params.get("output_modalities", params.get("modalities"))
        if modalities is not None:
            if not isinstance(modalities, list) or not modalities or not set(modalities) <= {"audio", "text"}:
                raise rt.RealtimeProtocolError(
                    "invalid_value",
                    'output_modalities must be ["audio"] or ["text"]',
                    param="response.output_modalities",
                    event_id=event_id,
                )
            self._next_output = "audio" if "audio" in modalities else "text"
        instructions = params.get("instructions")
        self._next_metadata = params.get("metadata")
        if not (self._committed or self._texts or (isinstance(instructions, str) and instructions.strip())):
            self._next_output = self._next_metadata = None
            raise rt.RealtimeProtocolError(
                "conversation_empty",
                "nothing to answer: commit audio or add a user message first (or give response.instructions)",
                event_id=event_id,
            )
        agent = self._start_agent()
        if self._committed:
            audio, self._committed = np.concatenate(self._committed), []
            assert self._committed_item is not None
            pending = _Pending(
                self._committed_item, audio=True, committed=True, seconds=audio.size / self.vad.sample_rate
            )
            heard = agent.end_turn(audio)
        elif self._texts:
            item_id, text = self._texts[-1][0], "\n".join(t for _, t in self._texts)
            self._texts = []
            pending = _Pending(item_id, audio=False, committed=True)
            heard = agent.end_turn(text=text)
        else:  # nothing new from the user: the response's own instructions are the turn (a greeting, a nudge)
            assert isinstance(instructions, str)
            pending = _Pending(rt.new_id("item"), audio=False, committed=True)
            heard = agent.end_turn(text=instructions)
        if not heard:  # blank text: no turn for the agent, so no response is coming
            self._next_output = self._next_metadata = None
            raise rt.RealtimeProtocolError("conversation_empty", "the message to answer is blank", event_id=event_id)
        self._pending.append(pending)

    async def _cancel(self, event_id: str | None, *, quiet: bool) -> None:
        response = self._response
        if response is None or response.cancelled is not None:
            if quiet:
                return
            raise rt.RealtimeProtocolError(
                "response_cancel_not_active", "there is no response in progress to cancel", event_id=event_id
            )
        response.cancelled = "client_cancelled"
        self._drop_audio()  # not one more delta of it goes out
        if self._agent is not None:
            await self._agent.cut_reply()

    # the agent's side (Transport) -----------------------------------------------------------------

    def _start_agent(self) -> VoiceAgent:
        if self._agent is None:
            assert self._tg is not None
            self._agent = VoiceAgent(
                self.session,
                self,
                stt=self._stt,
                tts=self._tts,
                vad=self.vad,
                max_reply_tokens=self._reply_tokens(),
                decode_tokens=self.config.decode_tokens,
                barge_in=0.06 if self.settings.interrupt_response else None,
                stats_interval=3600.0,  # the stats event has no Realtime equivalent; rate_limits.updated says it
                early_transcribe=True,  # as the WebRTC demo's agent: the turn's transcript starts at a pause
                on_latency=self._on_latency,
            )
            self._listen_by_words()
            self._tg.start_soon(self._run_agent, self._agent)
        return self._agent

    def _listen_by_words(self) -> None:
        """``semantic_vad``: the words model may end a turn at a short pause, and the silence waits longer."""
        semantic = self.settings.turn_detection == "semantic_vad" and self._text_turn is not None
        self.vad.end_silence = self.config.semantic_silence if semantic else self._server_silence
        if self._agent is not None:
            self._agent.text_turn = self._text_turn if semantic else None
            # the words are read at the pause: a shorter one, as the WebRTC demo's (docs/voice-agent.md)
            self._agent.pause = _SEMANTIC_PAUSE if semantic else _SERVER_PAUSE

    def _reply_tokens(self) -> int:
        limit = self.settings.max_output_tokens
        return self.config.max_reply_tokens if limit is None else min(limit, self.config.max_reply_tokens)

    async def _run_agent(self, agent: VoiceAgent) -> None:
        try:
            await agent.run()
        except MetronomeError as exc:  # the agent sent its error event; the connection ends with it
            self.failure = exc
            await self._close(_CLOSE_OVERLOADED if isinstance(exc, Overloaded) else _CLOSE_FAILED)
        except Exception as exc:  # a bug of ours: logged here, the client told only that the server failed
            self._log.exception("realtime.agent_failed")
            self.failure = exc
            with anyio.CancelScope(shield=True):
                message = "the server failed this session; see its log"
                await self._send(rt.error_event("server_error", message, type="server_error"))
                await self._close(_CLOSE_FAILED)

    async def receive_audio(self) -> InputFrame:
        await self._observe_turn()
        return await self._mic_out.receive()

    async def _observe_turn(self) -> None:
        """Speech started or stopped in the detector since the last frame: tell the client (server VAD)."""
        speaking = self.vad.speaking
        if speaking and self._speech_item is None:
            self._speech_item = item = rt.new_id("item")
            start = max(0, round((self._received / rt.RATE - self.vad.speech_heard) * 1000))
            self._speech_start_ms = start
            await self._send(rt.server_event("input_audio_buffer.speech_started", audio_start_ms=start, item_id=item))
        elif not speaking and self._speech_item is not None:
            item, self._speech_item = self._speech_item, None
            self._pending.append(_Pending(item, audio=True, committed=False, seconds=self._speech_seconds()))
            end = round(self._received / rt.RATE * 1000)
            await self._send(rt.server_event("input_audio_buffer.speech_stopped", audio_end_ms=end, item_id=item))

    def _speech_seconds(self) -> float:
        return max(0.0, self._received / rt.RATE - self._speech_start_ms / 1000)

    async def send_event(self, event: Event) -> None:
        kind = event.get("type")
        if kind == "state" and event.get("state") == "thinking":
            await self._turn_heard()
        elif kind == "transcript" and event.get("role") == "user" and event.get("final", True):
            await self._transcribed(str(event.get("text", "")))
        elif kind == "transcript" and event.get("role") == "user":  # a tentative transcript, while heard
            await self._transcribing(str(event.get("text", "")))
        elif kind == "transcript" and event.get("role") == "assistant":
            await self._reply_text(event)
        elif kind == "state" and event.get("state") == "listening":
            await self._turn_done()
        elif kind == "interrupted":
            response = self._response
            if response is not None and response.cancelled is None:
                response.cancelled = "turn_detected"
            self._drop_audio()
        elif kind == "error":
            code, type_ = rt.failure_code(str(event.get("error")))
            await self._send(
                rt.error_event(
                    code,
                    str(event.get("message") or code),
                    type=type_,
                    retry_after=event.get("retry_after") if event.get("retryable") else None,
                )
            )
        # ready, state, frame, latency, stats, closed: no Realtime counterpart

    async def _turn_heard(self) -> None:
        await self._observe_turn()  # the detector ended the turn after the last frame was taken
        # the last reply is decoded, and its clauses are the ones the voice still has: let them go out
        # (a barge-in cut them already), so that none of its audio goes out as the next response's
        with anyio.move_on_after(60):
            while self._response is not None:
                await anyio.sleep(0.02)
        if self._response is not None:
            self._response.cancelled = self._response.cancelled or "turn_detected"
            await self._finish(self._response)
        while len(self._pending) > 1:  # turns heard while the agent was busy: it answers only the latest
            self._pending.popleft()
        pending = self._pending.popleft() if self._pending else _Pending(rt.new_id("item"), audio=True, committed=False)
        if pending.audio and not pending.committed:
            await self._send_committed(pending.item_id, self._last_item())
        output = self._next_output or self.settings.output
        async with self._ending:  # the last response's response.done goes out first
            response = self._response = _Response(
                rt.new_id("resp"),
                output=output,
                user_item=pending.item_id if pending.audio else None,
                metadata=self._next_metadata,
            )
            self._next_output = self._next_metadata = None
            response.transcribed = not pending.audio
            response.heard_seconds = pending.seconds
            if self._agent is not None:
                self._agent.speak = output == "audio"  # a text response is not synthesized at all
            created = rt.server_event("response.created", response=self._response_object(response, "in_progress"))
            await self._send(created)
        self._wake.set()

    async def _transcribed(self, text: str) -> None:
        response = self._response
        if response is None or response.user_item is None or response.transcribed:
            return
        response.transcribed = True
        await self._send(
            rt.server_event(
                "conversation.item.input_audio_transcription.completed",
                item_id=response.user_item,
                content_index=0,
                transcript=text,
                usage={"type": "duration", "seconds": round(response.heard_seconds, 3)},
            )
        )
        item = rt.message_item(response.user_item, "user", [{"type": "input_audio", "transcript": text}])
        await self._send(rt.server_event("conversation.item.done", item=item))

    async def _transcribing(self, text: str) -> None:
        response = self._response
        item = self._speech_item or (response.user_item if response is not None and not response.transcribed else None)
        if item is not None and text:
            event = rt.server_event(
                "conversation.item.input_audio_transcription.delta", item_id=item, content_index=0, delta=text
            )
            await self._send(event)

    async def _turn_done(self) -> None:
        """The agent is done with the turn's text (an empty transcript has no reply at all)."""
        response = self._response
        if response is None:
            return
        await self._transcribed("")
        response.decoded = True
        self._wake.set()

    async def _reply_text(self, event: Event) -> None:
        response = self._response
        if response is None:
            return
        text = str(event.get("text", ""))
        if event.get("final"):
            response.decoded = True
            if event.get("interrupted") and response.cancelled is None:
                response.cancelled = "turn_detected"
            self._wake.set()
            return
        if response.cancelled is not None or not text:
            return
        await self._announce(response)
        response.text.append(text)
        kind = "response.output_audio_transcript.delta" if response.output == "audio" else "response.output_text.delta"
        await self._send(rt.server_event(kind, **self._where(response), delta=text))

    async def send_audio(self, samples: npt.NDArray[np.int16], sample_rate: int) -> None:
        response = self._response
        if response is None or response.cancelled is not None or response.output != "audio" or not samples.size:
            return
        pcm = resample(samples, sample_rate, rt.RATE)
        for i in range(0, pcm.size, _CHUNK):
            self._audio.append((response, pcm[i : i + _CHUNK]))
        self._wake.set()

    @property
    def queued_audio_seconds(self) -> float:
        """Reply audio not yet sent, and what the client has been sent ahead of real time (still playing)."""
        unsent = sum(chunk.size for _, chunk in self._audio) / rt.RATE
        response = self._response
        ahead = 0.0
        if response is not None and not math.isnan(response.first_audio_at):
            ahead = max(0.0, response.audio_sent / rt.RATE - (time.monotonic() - response.first_audio_at))
        return unsent + ahead

    def clear_audio(self) -> None:
        self._drop_audio()

    def _drop_audio(self) -> None:
        self._audio.clear()

    async def aclose(self) -> None:
        """The agent hung up (its run ended): nothing more to say on this connection."""

    # reply audio and the response's end -----------------------------------------------------------

    async def _pace_audio(self) -> None:
        with contextlib.suppress(SessionBroken):  # the client stopped reading: it was cut off (_send)
            await self._pace()

    async def _pace(self) -> None:
        while True:
            if self._audio:
                response, chunk = self._audio.popleft()
                if response is not self._response or response.cancelled is not None:
                    continue
                await self._announce(response)
                if math.isnan(response.first_audio_at):
                    response.first_audio_at = time.monotonic()
                ahead = response.audio_sent / rt.RATE - (time.monotonic() - response.first_audio_at)
                if ahead > self.config.audio_lead:
                    await anyio.sleep(ahead - self.config.audio_lead)
                    if response.cancelled is not None:  # cancelled while it waited its turn
                        continue
                response.audio_sent += chunk.size
                delta = rt.encode_audio(chunk)
                await self._send(rt.server_event("response.output_audio.delta", **self._where(response), delta=delta))
                continue
            current = self._response
            agent = self._agent
            if current is not None and current.decoded and (agent is None or agent.unspoken == 0):
                await self._finish(current)
                continue
            self._wake = anyio.Event()
            with anyio.move_on_after(0.05):
                await self._wake.wait()

    async def _announce(self, response: _Response) -> None:
        if response.started:
            return
        response.started = True
        item = rt.message_item(response.item_id, "assistant", [], status="in_progress")
        await self._send(
            rt.server_event("response.output_item.added", response_id=response.id, output_index=0, item=item)
        )
        await self._send(rt.server_event("conversation.item.added", previous_item_id=response.user_item, item=item))
        part = {"type": "audio", "transcript": ""} if response.output == "audio" else {"type": "text", "text": ""}
        await self._send(rt.server_event("response.content_part.added", **self._where(response), part=part))

    def _where(self, response: _Response) -> dict[str, Any]:
        return {"response_id": response.id, "item_id": response.item_id, "output_index": 0, "content_index": 0}

    async def _finish(self, response: _Response) -> None:
        async with self._ending:
            await self._end(response)

    async def _end(self, response: _Response) -> None:
        if self._response is response:
            self._response = None
        self._audio = deque(c for c in self._audio if c[0] is not response)
        text = " ".join("".join(response.text).split())
        status = "completed" if response.cancelled is None else "cancelled"
        output = []
        if response.started:
            where = self._where(response)
            if response.output == "audio":
                await self._send(rt.server_event("response.output_audio.done", **where))
                await self._send(rt.server_event("response.output_audio_transcript.done", **where, transcript=text))
                part = {"type": "audio", "transcript": text}
                content = {"type": "output_audio", "transcript": text}
            else:
                await self._send(rt.server_event("response.output_text.done", **where, text=text))
                part = {"type": "text", "text": text}
                content = {"type": "output_text", "text": text}
            await self._send(rt.server_event("response.content_part.done", **where, part=part))
            item = rt.message_item(
                response.item_id, "assistant", [content], status="completed" if status == "completed" else "incomplete"
            )
            output.append(item)
            await self._send(
                rt.server_event("response.output_item.done", response_id=response.id, output_index=0, item=item)
            )
            await self._send(rt.server_event("conversation.item.done", item=item))
        body = self._response_object(response, status, output)
        await self._send(rt.server_event("response.done", response=body))
        await self._send_rate_limits()

    def _response_object(
        self, response: _Response, status: str, output: list[dict[str, Any]] | None = None
    ) -> dict[str, Any]:
        details: dict[str, Any] | None = None
        if status == "cancelled":
            details = {"type": "cancelled", "reason": response.cancelled}
        return {
            "id": response.id,
            "object": "realtime.response",
            "status": status,
            "status_details": details,
            "output": output or [],
            "output_modalities": [response.output],
            "audio": {"output": {"format": dict(rt.FORMAT), "voice": self.settings.voice}},
            "usage": None,
            "metadata": response.metadata,
        }

    # the socket -----------------------------------------------------------------------------------

    def _session_object(self) -> dict[str, Any]:
        return self.settings.as_session(self._id, self.model)

    async def _send_rate_limits(self) -> None:
        s = self.engine.stats()
        block_size = self.engine.config.block_size if self.engine.config is not None else 16
        limits = rt.rate_limits(
            sessions=s.sessions,
            limit=s.limit,
            pool_blocks=s.pool_blocks,
            used_blocks=s.used_blocks,
            block_size=block_size,
        )
        await self._send(rt.server_event("rate_limits.updated", rate_limits=limits))

    async def _send(self, event: Event) -> None:
        """Send one event; a client that does not read for ``send_timeout`` is cut off (``SessionBroken``)."""
        if self.ws.closed:
            return
        try:
            with anyio.fail_after(self.config.send_timeout):
                async with self._send_lock:
                    await self.ws.send_json(event)
        except TimeoutError:
            exc = SessionBroken(
                f"the client read nothing for {self.config.send_timeout:g} s; disconnected",
                session_id=self.session.id,
            )
            self._log.warning("realtime.client_not_reading", send_timeout=self.config.send_timeout)
            self.failure = exc
            self._abort()
            raise exc from None
        except ConnectionResetError:  # the client left mid-send
            self.gone = True

    async def _fail(self, exc: BaseException) -> None:
        await self._send(rt.failure_event(exc))
        await self._close(_CLOSE_OVERLOADED if isinstance(exc, Overloaded) else _CLOSE_FAILED)

    async def _close(self, code: int) -> None:
        with anyio.move_on_after(self.config.send_timeout):
            await self.ws.close(code=code)
        if not self.ws.closed:
            self._abort()

    def _abort(self) -> None:
        transport = self._request.transport
        if transport is not None:
            transport.abort()
        self.gone = True


async def serve_realtime(  # the handler's body, for ChatServer
    request: web.Request,
    engine: Engine,
    session: Session,
    *,
    config: RealtimeConfig,
    model: str,
    stt: SpeechToText,
    tts: TextToSpeech,
    vad: Callable[[], VoiceActivityDetector],
    on_latency: Callable[[TurnLatency], None] | None = None,
    text_turn: TextTurnModel | None = None,
) -> web.WebSocketResponse:
    ws = web.WebSocketResponse(max_msg_size=config.max_message_bytes, heartbeat=30.0)
    transport: RealtimeTransport | None = None
    try:
        await ws.prepare(request)
        transport = RealtimeTransport(
            ws,
            request,
            engine,
            session,
            config=config,
            model=model,
            stt=stt,
            tts=tts,
            vad=vad,
            on_latency=on_latency,
            text_turn=text_turn,
        )
        await transport.run()
    finally:
        # in a task of its own: aiohttp cancels a handler whose client left, and a close cut half-way
        # would keep the session's blocks (a session.update may have reopened it: close both)
        await asyncio.shield(session.aclose())
        if transport is not None:
            await asyncio.shield(transport.session.aclose())
        if not ws.closed:
            with anyio.move_on_after(1.0):
                await ws.close()
    return ws
