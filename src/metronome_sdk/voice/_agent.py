"""A voice agent: hear an utterance, transcribe it, let the session answer, speak the answer.

The session answers on the metronome, one output frame per tick; every frame's latency
goes to the peer as an event beside the words, so a slow engine shows as late frames and
a failing one as a typed error (then a hang-up), never as a silence that looks healthy.
"""

from __future__ import annotations

import math
import re

import anyio
import numpy as np
import numpy.typing as npt

from .._exceptions import MetronomeError, Overloaded, SessionBroken, SessionClosed
from .._frames import OutputFrame
from .._log import get_logger
from .._session import Session
from ..transports._base import Event, Transport
from ._audio import pcm16, resample
from ._protocols import SpeechToText, TextToSpeech
from ._vad import VoiceActivityDetector

__all__ = ["VoiceAgent", "error_event", "stats_event"]

_SENTENCE_END = re.compile(r"[.!?;:]\s*$")


def error_event(exc: BaseException) -> Event:
    """The ``error`` event that tells a peer what went wrong (type name, message, whether to retry)."""
    event: Event = {"type": "error", "error": type(exc).__name__, "message": str(exc)}
    event["retryable"] = isinstance(exc, Overloaded)
    if isinstance(exc, Overloaded):
        event["retry_after"] = exc.retry_after
    return event


def stats_event(session: Session) -> Event:
    """The engine's admission cap, pool occupancy and latency, as a ``stats`` event."""
    engine = session.engine
    if engine is None:
        return {"type": "stats"}
    s = engine.stats()
    return {
        "type": "stats",
        "sessions": s.sessions,
        "limit": s.limit,
        "memory_limit": s.memory_limit,
        "used_blocks": s.used_blocks,
        "pool_blocks": s.pool_blocks,
        "occupancy": s.occupancy,
        "latency_p50": s.latency_p50,
        "latency_p95": s.latency_p95,
        "deadline": s.deadline,
        "deadline_misses": s.deadline_misses,
        "stalls": s.stalls,
        "t_sat": None if s.t_sat is None or not math.isfinite(s.t_sat) else s.t_sat,
    }


def frame_event(out: OutputFrame, deadline: float) -> Event:
    return {
        "type": "frame",
        "index": out.index,
        "tick": out.tick,
        "latency": out.latency,
        "deadline": deadline,
        "deadline_missed": out.deadline_missed,
    }


class VoiceAgent:
    """Turn-taking conversation between a peer (a ``Transport``) and an open ``Session``.

    Voice activity ends a turn; ``stt`` transcribes it on a worker thread; the session
    answers with the model's chat template, one token per tick, up to ``max_reply_tokens``;
    each sentence goes to ``tts`` as soon as it is complete. ``run()`` closes the transport
    and returns when the peer hangs up. If the engine fails the session (``EngineStalled``, ``LoadShed``,
    ``CacheExhausted``...), the peer gets an ``error`` event and a ``closed`` event, the
    transport is closed, and ``run()`` raises that error. The caller owns the session.
    """

    def __init__(
        self,
        session: Session,
        transport: Transport,
        *,
        stt: SpeechToText,
        tts: TextToSpeech,
        vad: VoiceActivityDetector | None = None,
        max_reply_tokens: int = 48,
        stats_interval: float = 0.5,
    ) -> None:
        if not isinstance(stt, SpeechToText):
            raise ValueError(f"stt must have transcribe(samples, sample_rate), got {stt!r}")
        if not isinstance(tts, TextToSpeech):
            raise ValueError(f"tts must have synthesize(text), got {tts!r}")
        if isinstance(max_reply_tokens, bool) or not isinstance(max_reply_tokens, int) or max_reply_tokens < 1:
            raise ValueError(f"max_reply_tokens must be an int >= 1, got {max_reply_tokens!r}; try 48")
        self.session = session
        self.transport = transport
        self.stt = stt
        self.tts = tts
        self.vad = vad or VoiceActivityDetector()
        self.max_reply_tokens = max_reply_tokens
        self.stats_interval = stats_interval
        self._log = get_logger(session_id=session.id)
        self._utterance: npt.NDArray[np.int16] | None = None
        self._heard = anyio.Event()
        self._failure: MetronomeError | None = None
        self._speech_in, self._speech_out = anyio.create_memory_object_stream[str](64)

    async def run(self) -> None:
        engine = self.session.engine
        deadline = engine.timing.frame_deadline if engine is not None else None
        await self.transport.send_event({"type": "ready", "session_id": self.session.id, "deadline": deadline})
        await self.transport.send_event({"type": "state", "state": "listening"})
        with self._speech_in, self._speech_out:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._stats_loop, tg.cancel_scope)
                tg.start_soon(self._reply_loop, tg.cancel_scope)
                tg.start_soon(self._speak_loop)
                await self._listen()
                tg.cancel_scope.cancel()
        if self._failure is None:
            self._log.info("voice.hung_up")
            with anyio.CancelScope(shield=True):
                await self.transport.aclose()
            return
        failure = self._failure
        if not isinstance(failure, SessionBroken):  # a vanished peer cannot be told anything
            with anyio.CancelScope(shield=True):
                await self.transport.send_event(error_event(failure))
                await self.transport.send_event({"type": "closed", "reason": type(failure).__name__})
        with anyio.CancelScope(shield=True):
            await self.transport.aclose()
        self._log.warning("voice.failed", error=type(failure).__name__)
        raise failure

    async def _listen(self) -> None:
        while self._failure is None:
            try:
                frame = await self.transport.receive_audio()
            except anyio.EndOfStream:
                return
            except SessionBroken as exc:
                self._failure = exc
                return
            assert frame.sample_rate is not None
            pcm = pcm16(frame.samples_float32())
            if frame.sample_rate != self.vad.sample_rate:
                pcm = resample(pcm, frame.sample_rate, self.vad.sample_rate)
            for utterance in self.vad.push(pcm):
                self._utterance = utterance  # a newer turn replaces one not yet answered
                self._heard.set()

    async def _reply_loop(self, scope: anyio.CancelScope) -> None:
        try:
            while True:
                await self._heard.wait()
                self._heard = anyio.Event()
                utterance, self._utterance = self._utterance, None
                if utterance is None:
                    continue
                await self.transport.send_event({"type": "state", "state": "thinking"})
                text = await anyio.to_thread.run_sync(self.stt.transcribe, utterance, self.vad.sample_rate)
                self._log.info("voice.heard", chars=len(text), seconds=utterance.size / self.vad.sample_rate)
                if text:
                    await self.transport.send_event({"type": "transcript", "role": "user", "text": text, "final": True})
                    await self._answer(text)
                await self.transport.send_event({"type": "state", "state": "listening"})
        except MetronomeError as exc:
            self._failure = exc
            scope.cancel()

    async def _answer(self, text: str) -> None:
        engine = self.session.engine
        deadline = engine.timing.frame_deadline if engine is not None else math.nan
        reply: list[str] = []
        sentence = ""
        out = await self.session.step(text)
        produced = 1
        while True:
            await self.transport.send_event(frame_event(out, deadline))
            if out.text:
                reply.append(out.text)
                sentence += out.text
                await self.transport.send_event(
                    {"type": "transcript", "role": "assistant", "text": out.text, "final": False}
                )
            last = out.stop or produced >= self.max_reply_tokens
            if sentence.strip() and (last or _SENTENCE_END.search(sentence)):
                await self._speech_in.send(sentence.strip())
                sentence = ""
            if last:
                break
            out = await self.session.step()
            produced += 1
        answer = "".join(reply).strip()
        await self.transport.send_event({"type": "transcript", "role": "assistant", "text": answer, "final": True})
        self._log.info("voice.answered", frames=produced, chars=len(answer), stopped=out.stop)

    async def _speak_loop(self) -> None:
        async for sentence in self._speech_out:
            try:
                samples, rate = await anyio.to_thread.run_sync(self.tts.synthesize, sentence)
            except Exception as exc:  # a broken voice is reported, and the words still went out as text
                self._log.warning("voice.tts_failed", error=repr(exc))
                await self.transport.send_event(error_event(exc))
                continue
            if samples.size:
                await self.transport.send_audio(pcm16(samples), rate)

    async def _stats_loop(self, scope: anyio.CancelScope) -> None:
        while True:
            if self.session.closed:  # closed under us (the engine shut down) while nobody was stepping
                self._failure = SessionClosed(
                    f"session {self.session.id} was closed by its engine", session_id=self.session.id
                )
                scope.cancel()
                return
            await self.transport.send_event(stats_event(self.session))
            await anyio.sleep(self.stats_interval)
