"""A voice agent: hear an utterance, transcribe it, let the session answer, speak the answer.

The session answers on the metronome, one output frame per tick; every frame's latency
goes to the peer as an event beside the words, so a slow engine shows as late frames and
a failing one as a typed error (then a hang-up), never as a silence that looks healthy.

Why this module is past 400 lines: ``VoiceAgent`` is one conversation whose four loops
(listening, answering, speaking, stats) share its turn state and barge-in; the events and
``TurnLatency`` beside it are small values it sends.
"""

from __future__ import annotations

import itertools
import math
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import anyio
import anyio.abc
import numpy as np
import numpy.typing as npt

from .._audio import pcm16, resample, without_lead
from .._exceptions import (
    MetronomeError,
    Overloaded,
    RewindUnavailable,
    SessionBroken,
    SessionClosed,
    TurnInterrupted,
)
from .._frames import OutputFrame
from .._log import get_logger
from .._session import Interrupted, Session
from ..transports._base import Event, Transport
from ._ahead import MARGIN, Ahead
from ._history import PromptMark
from ._protocols import Playback, SharedVoice, SpeechToText, TextToSpeech
from ._text_turn import TextTurnModel
from ._turn import TurnModel
from ._vad import VoiceActivityDetector

__all__ = ["TurnLatency", "VoiceAgent", "clause_end", "error_event", "stats_event"]

# seconds of quiet after which the utterance so far is transcribed: two of Silero's 32 ms windows,
# so a gap inside a word starts none; the turn still ends no sooner than ``pause``
TRANSCRIBE_PAUSE = 0.05
_CLAUSE_MARK = re.compile(r"[.!?;:,]+(?=\s|$)")
_WHOLE_WORD = re.compile(r"\S+(?=\s)")  # a word with a space after it: no token will lengthen it


def check_first_words(words: int | None) -> int | None:
    """``words`` as the first part's cap in whole words (``None``: no cap), or ``ValueError``."""
    if words is not None and (isinstance(words, bool) or not isinstance(words, int) or words < 1):
        raise ValueError(f"first_words must be an int >= 1, or None, got {words!r}; try 6")
    return words


def check_transcribe_pause(seconds: float | None) -> float | None:
    """``seconds`` as the quiet before hearing ahead (``None``: the turn's ``pause``), or ``ValueError``."""
    if seconds is not None and (
        isinstance(seconds, bool) or not isinstance(seconds, int | float) or not 0 < seconds <= 2
    ):
        raise ValueError(f"transcribe_pause must be in (0, 2] seconds, or None for pause; got {seconds!r}")
    return seconds


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
        "tokens": len(out.tokens),
    }


@dataclass(frozen=True, slots=True)
class TurnLatency:
    """Where one turn's voice-to-voice time went, in seconds of wall-clock time.

    ``voice_to_voice``: from the end of the caller's speech to the first reply audio handed to
    the transport (the figure voice-app developers compare). It is the sum of its parts, one
    after the other on the turn's critical path:

    - ``turn_end``: the pause the turn detector waited for (nothing when the caller's audio stopped);
    - ``transcribe``: speech to text;
    - ``first_token``: the session's prefill of the turn, up to the reply's first token;
    - ``first_clause``: decoding on, up to the first clause the voice can speak (``first_clause_words``);
    - ``synthesize``: that clause to speech;
    - ``send``: the speech waiting for the voice loop and handed to the transport.

    ``ahead``: the turn was answered ahead, at a pause, before it ended; the parts done before
    the turn ended count as no wait (0), so the parts still add up to ``voice_to_voice``.

    ``speech_work``: the seconds the recognizer and the voice ran for this turn (its transcription
    and its first part's synthesis), wherever they ran: work done during the pause is no wait for
    a lone caller, but callers whose turns end together queue for it (``VoiceAdmission`` reads it).
    NaN where a part did not run here (a typed turn).
    """

    voice_to_voice: float
    turn_end: float
    transcribe: float
    first_token: float
    first_clause: float
    synthesize: float
    send: float
    ahead: bool = False
    speech_work: float = math.nan

    def as_dict(self) -> dict[str, float]:
        return {
            "voice_to_voice": self.voice_to_voice,
            "turn_end": self.turn_end,
            "transcribe": self.transcribe,
            "first_token": self.first_token,
            "first_clause": self.first_clause,
            "synthesize": self.synthesize,
            "send": self.send,
        }

    def event(self) -> Event:
        work = self.speech_work if math.isfinite(self.speech_work) else None  # JSON has no NaN
        return {"type": "latency", **self.as_dict(), "ahead": self.ahead, "speech_work": work}


def clause_end(text: str, *, first: bool, min_words: int, max_words: int | None = None) -> int | None:
    """Where the speakable part of ``text`` ends (an index into it), or None to wait for more.

    A sentence ends at ``.!?;:`` followed by a space or the text's end; the first part of a
    reply may end sooner, at a comma (a clause) with at least ``min_words`` words before it, so
    that the voice starts on the first clause while the rest decodes, or after ``max_words``
    whole words (a word is whole once a space follows it), so that a long first sentence with no
    comma does not hold the first audio back. A mark inside a word or a number (``3.5``,
    ``1,000``) is no end; one right after a digit at the text's end waits for the next token.
    """
    cap = None
    if first and max_words is not None:
        words = list(itertools.islice(_WHOLE_WORD.finditer(text), max_words))
        if len(words) == max_words:
            cap = words[-1].end()
    for m in _CLAUSE_MARK.finditer(text):
        if cap is not None and m.start() >= cap:
            break
        if m.end() == len(text) and m.start() > 0 and text[m.start() - 1].isdigit():
            return None  # "3." may go on as "3.5": the next token says
        if m.group().startswith(",") and not (first and len(text[: m.start()].split()) >= min_words):
            continue
        return m.end()
    return cap


@dataclass(slots=True)
class _Early:
    """A transcription of the utterance so far, started at a pause while the caller may go on."""

    utterance: int  # which utterance (the agent counts them)
    samples: int  # how much of it: the speech up to the pause
    done: anyio.Event
    text: str | None = None  # None: not done, or failed (the turn's own transcription then tries)
    seconds: float = math.nan  # how long the recognizer ran for it


@dataclass(slots=True)
class _Turn:
    number: int
    utterance: npt.NDArray[np.int16]
    speech_end: float  # time.monotonic() when the caller stopped speaking
    heard_at: float  # when the turn detector ended the turn
    early: _Early | None = None  # a transcription of exactly this utterance, started at its last pause
    transcribed_at: float = math.nan
    first_token_at: float = math.nan
    first_clause_at: float = math.nan
    synthesized_at: float = math.nan  # the first clause's speech is ready
    first_synthesis_at: float = math.nan  # and handed to the transport
    answered: bool = False  # the session's reply is complete (or cut)
    text: str | None = None  # a typed turn (end_turn(text=...)): nothing to transcribe
    ahead: Ahead | None = None  # answered at a pause, before the turn detector ended the turn
    transcribe_seconds: float = math.nan  # the recognizer's run for this turn, wherever it ran
    synthesize_seconds: float = math.nan  # the voice's run for its first part
    # the first part's synthesis is over (or will not run): the reply decodes on only then
    voiced: anyio.Event = field(default_factory=anyio.Event)


class VoiceAgent:
    """Turn-taking conversation between a peer (a ``Transport``) and an open ``Session``.

    A turn ends when ``vad`` hears a pause, or when the caller's audio stops: its track ended
    (``receive_audio`` raised ``anyio.EndOfStream``) or no frame came for ``turn_gap``
    seconds. ``stt`` transcribes it on a worker thread; the session answers with the model's
    chat template, up to ``max_reply_tokens``; each clause goes to ``tts`` as soon as it is
    complete (the first one at a comma after ``clause_words`` words, or after ``first_words`` whole
    words when no mark came sooner; later ones at the end of a sentence; ``clause_end``), and its
    speech to the transport as soon as it is synthesized, while the rest decodes; ``decode_tokens``
    (the session's own setting when None) lets each output frame carry several tokens, so the
    first clause is whole in fewer ticks. Each frame goes to
    the session ``beat_lead`` seconds before the engine's next tick (``Engine.next_tick``;
    ``None``: at once), so its latency is the engine's work, not a wait for the metronome's
    phase, and the reply comes no later.

    Hearing ahead: with ``early_transcribe``, once the caller has paused for ``transcribe_pause``
    seconds (0.05; ``pause`` when None or shorter) the utterance so far is transcribed on a worker thread while the
    turn detector still waits; if the turn ends with nothing said since, that transcript is the
    turn's, and only what is left of it is waited for (one such transcription in flight at a time:
    a pause while one runs is skipped until it is done). With ``turn_model`` (``SmartTurn``), a
    pause of ``pause`` seconds asks the model whether the caller sounds finished; with
    ``text_turn`` (``TextTurn``, which needs ``early_transcribe``), whether the pause's transcript
    reads as finished. When every model given says so and the pause has lasted ``pause``, the turn
    ends there instead of after ``vad``'s silence: a shorter ``transcribe_pause`` has the transcript
    and the words' verdict ready sooner without ending any turn sooner than ``pause``.

    Answering ahead: with ``answer_ahead`` and a session opened with ``rewind_tokens``,
    once a pause's transcript is ready while the caller is still quiet, the agent also starts
    the answer: it marks the session (``Session.mark``), appends the turn and decodes and
    synthesizes up to the first clause, holding back every event and all speech. When the
    turn then ends with nothing said since, what was held goes out at once; when the caller
    goes on, the answer is withdrawn (``Session.rewind``: the context is as if it had never
    been) and nothing of it reached the caller. ``answered_ahead`` and ``withdrawn_ahead``
    count them.

    History: with ``history`` (the default) the model sees the call's earlier turns, as far as
    the session's window reaches. ``history=False`` (a session opened with ``rewind_tokens``)
    takes each turn back once it is answered, so every question is heard as the call's first
    (a small model answers better so; ``PromptMark``). Each answered turn's
    ``TurnLatency`` goes to the peer as a ``latency`` event, into ``stats`` events as
    ``voice_to_voice``, and to ``on_latency`` (a server's voice admission reads it there).

    Barge-in: when the caller speaks for ``barge_in`` seconds while a reply is under way, the
    reply stops at once: ``Session.interrupt()`` withdraws the frame being decoded, so the
    session's context keeps only the reply tokens the agent had received (and sent to the peer
    as transcript) before the cut (``last_cut``); no more sentences are spoken, and on a
    transport that plays audio in real time (``Playback``, as ``WebRTCPeer``) the queued reply
    audio is cut.

    ``run()`` answers the turn in progress when the caller's audio ends (and lets it play
    out), then closes the transport and returns. If the engine fails the session
    (``EngineStalled``, ``LoadShed``, ``CacheExhausted``...), the peer gets an ``error`` event
    and a ``closed`` event, the transport is closed, and ``run()`` raises that error. The
    caller owns the session.
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
        turn_gap: float = 0.5,
        barge_in: float | None = 0.06,
        decode_tokens: int | None = None,
        beat_lead: float | None = 0.01,
        clause_words: int = 3,
        first_words: int | None = 6,
        early_transcribe: bool = False,
        turn_model: TurnModel | None = None,
        text_turn: TextTurnModel | None = None,
        pause: float = 0.2,
        transcribe_pause: float | None = TRANSCRIBE_PAUSE,
        on_latency: Callable[[TurnLatency], None] | None = None,
        answer_ahead: bool = False,
        history: bool = True,
    ) -> None:
        if not isinstance(stt, SpeechToText):
            raise ValueError(f"stt must have transcribe(samples, sample_rate), got {stt!r}")
        if not isinstance(tts, TextToSpeech):
            raise ValueError(f"tts must have synthesize(text), got {tts!r}")
        if isinstance(max_reply_tokens, bool) or not isinstance(max_reply_tokens, int) or max_reply_tokens < 1:
            raise ValueError(f"max_reply_tokens must be an int >= 1, got {max_reply_tokens!r}; try 48")
        if not 0.05 <= turn_gap <= 10.0:
            raise ValueError(f"turn_gap must be in [0.05, 10] seconds, got {turn_gap!r}; try 0.5")
        if barge_in is not None and not 0.0 < barge_in <= 2.0:
            raise ValueError(f"barge_in must be in (0, 2] seconds of speech, or None for no barge-in; got {barge_in!r}")
        if beat_lead is not None and not 0.0 <= beat_lead <= 1.0:
            raise ValueError(f"beat_lead must be in [0, 1] seconds, or None to send frames at once; got {beat_lead!r}")
        if isinstance(clause_words, bool) or not isinstance(clause_words, int) or clause_words < 1:
            raise ValueError(f"clause_words must be an int >= 1, got {clause_words!r}; try 3")
        if not 0.0 < pause <= 2.0:
            raise ValueError(f"pause must be in (0, 2] seconds, got {pause!r}; try 0.2")
        if turn_model is not None and not isinstance(turn_model, TurnModel):
            raise ValueError(f"turn_model must have complete(samples) and sample_rate, got {turn_model!r}")
        if text_turn is not None and not isinstance(text_turn, TextTurnModel):
            raise ValueError(f"text_turn must have finished(text), got {text_turn!r}")
        if text_turn is not None and not early_transcribe:
            raise ValueError("text_turn reads the transcript of each pause: give early_transcribe=True as well")
        if decode_tokens is not None:
            session.decode_tokens = decode_tokens  # checked by the session; the agent is its consumer
        self.session = session
        self.transport = transport
        self.stt = stt
        self.tts = tts
        self.vad = vad or VoiceActivityDetector()
        if turn_model is not None and turn_model.sample_rate != self.vad.sample_rate:
            raise ValueError(
                f"turn_model hears {turn_model.sample_rate} Hz and vad {self.vad.sample_rate} Hz: give both the same"
            )
        self.early_transcribe = early_transcribe
        self.answer_ahead = answer_ahead
        self.history = history
        self._prompt = None if history else PromptMark(session)  # each turn goes back to the system prompt
        self.turn_model = turn_model
        self.text_turn = text_turn
        self.pause = pause
        self.transcribe_pause = check_transcribe_pause(transcribe_pause)
        self.max_reply_tokens = max_reply_tokens
        self.stats_interval = stats_interval
        self.turn_gap = turn_gap
        self.barge_in = barge_in
        self.beat_lead = beat_lead
        self.clause_words = clause_words
        self.first_words = check_first_words(first_words)
        self.on_latency = on_latency
        self.latencies: list[TurnLatency] = []
        self.interruptions = 0
        self.heard_ahead = 0  # turns whose transcript was started at a pause, before the turn ended
        self.answered_ahead = 0  # turns whose answer was started at a pause and confirmed by the turn's end
        self.withdrawn_ahead = 0  # answers started at a pause and taken back: the caller went on
        self._ahead: _Turn | None = None  # the turn being answered ahead, not yet confirmed
        self.speak = True  # False: replies go out as transcript only (a text-only client), nothing is synthesized
        self._log = get_logger(session_id=session.id)
        self._turns = 0
        self._next: _Turn | None = None  # heard, not yet answered
        self._heard = anyio.Event()
        self._replying: _Turn | None = None  # from transcription until its last sentence is spoken
        self._decoding: _Turn | None = None  # its reply's frames are being stepped: interrupt() cuts them
        self.last_cut: Interrupted | None = None  # what the last barge-in left in the session's context
        self._cut = 0  # replies to turns up to this number are cut (barge-in)
        self._unspoken = 0  # sentences sent to the voice and not yet handed to the transport
        self._failure: MetronomeError | None = None
        self._speech_in, self._speech_out = anyio.create_memory_object_stream[tuple[_Turn, str]](64)
        self._utterance = 0  # utterances heard (the one under way is the next)
        self._last_frame = time.monotonic()  # when the caller's last audio frame came
        self._early: _Early | None = None  # the last early transcription of the utterance under way
        self._transcribing = False  # an early transcription is in flight (at most one)
        self._asked: tuple[int, int] | None = None  # (utterance, samples) the turn model was last asked about
        self._asking = False  # the turn model is being asked (at most one question in flight)
        # what the turn models said of one pause: (utterance, samples) and {"sound"/"words": finished}
        self._verdict: tuple[tuple[int, int], dict[str, bool]] | None = None

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
                if await self._listen(tg):
                    await self._last_word()
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

    # listening -----------------------------------------------------------------------------------

    async def _listen(self, tg: anyio.abc.TaskGroup) -> bool:
        """Hear turns until the caller's audio ends; whether it ended with a turn still to answer."""
        last_frame = self._last_frame = time.monotonic()
        while self._failure is None:
            frame = None
            with anyio.move_on_after(self.turn_gap):
                try:
                    frame = await self.transport.receive_audio()
                except anyio.EndOfStream:
                    return self._end_turn(self.vad.flush(), last_frame)
                except SessionBroken as exc:
                    self._failure = exc
                    return False
            if frame is None:  # no audio for turn_gap: the caller's audio stopped, and with it the turn
                self._end_turn(self.vad.flush(), last_frame)
                continue
            last_frame = self._last_frame = time.monotonic()
            assert frame.sample_rate is not None
            pcm = pcm16(frame.samples_float32())
            if frame.sample_rate != self.vad.sample_rate:
                pcm = resample(pcm, frame.sample_rate, self.vad.sample_rate)
            for utterance in self.vad.push(pcm):
                self._end_turn(utterance, last_frame)
            ahead = self._ahead
            if ahead is not None and ahead.ahead is not None and self._heard_key() != ahead.ahead.key:
                self._withdraw(ahead)  # the caller went on after the pause it was answering
            self._at_pause(tg)
            await self._barge_in()
        return False

    def _heard_key(self) -> tuple[int, int] | None:
        """Which speech the turn under way has heard: (utterance, samples); None when no turn is under way."""
        return (self._utterance, self.vad.heard_samples) if self.vad.speaking else None

    def _withdraw(self, turn: _Turn) -> None:
        """Take back the answer started ahead: none of it is sent; the reply loop rewinds the session."""
        assert turn.ahead is not None
        self._ahead = None
        turn.ahead.withdraw()
        self._cut = max(self._cut, turn.number)
        self.withdrawn_ahead += 1
        if self._decoding is turn and not self.session.closed:
            self.session.interrupt()  # the frame being decoded is withdrawn, and with it the step that waits
        self._log.info("voice.ahead_withdrawn", turn=turn.number)

    def _end_turn(self, utterance: npt.NDArray[np.int16] | None, last_frame: float) -> bool:
        if utterance is None:
            return False
        ahead = self._ahead
        if ahead is not None and ahead.ahead is not None:
            if ahead.ahead.key == (self._utterance, utterance.size):  # nothing said since its pause: it is this turn
                self._ahead = None
                self._utterance += 1
                self._early = None
                now = time.monotonic()
                ahead.utterance = utterance
                ahead.speech_end = min(now, last_frame) - self.vad.silence_after
                ahead.heard_at = now
                ahead.ahead.confirm()
                self.answered_ahead += 1
                return True
            self._withdraw(ahead)
        early = self._early
        if early is None or (early.utterance, early.samples) != (self._utterance, utterance.size):
            early = None  # the caller went on after it started: it is not this turn's
        self._utterance += 1
        self._early = None
        self._turns += 1
        now = time.monotonic()
        speech_end = min(now, last_frame) - self.vad.silence_after
        # replaces one not answered
        self._next = _Turn(self._turns, utterance, speech_end=speech_end, heard_at=now, early=early)
        self._heard.set()
        return True

    def _at_pause(self, tg: anyio.abc.TaskGroup) -> None:
        """The caller has paused: transcribe what it said so far (after ``transcribe_pause``), and after
        ``pause`` ask the turn model whether it is done and end the turn if the models said so."""
        quiet = self.vad.pause
        start = self.pause if self.transcribe_pause is None else min(self.transcribe_pause, self.pause)
        start = max(start, self.vad.keep_pause)  # before it, the utterance still takes in its pause
        if not (self.early_transcribe or self.turn_model is not None) or quiet < start:
            return
        key = (self._utterance, self.vad.heard_samples)  # every frame of a pause: the audio is built only to send
        early = self._early
        fresh = early is None or (early.utterance, early.samples) != key
        if self.early_transcribe and not self._transcribing and fresh:
            heard = self.vad.heard_so_far()
            assert heard is not None and heard.size == key[1]
            self._early = _Early(self._utterance, heard.size, anyio.Event())
            self._transcribing = True
            tg.start_soon(self._transcribe_early, self._early, heard)
        if quiet < self.pause:
            return  # a transcript may be ready sooner; the turn ends no sooner than the pause
        self._end_if_judged()
        if self.turn_model is not None and not self._asking and self._asked != key:
            audio = self.vad.audio_so_far()
            assert audio is not None
            self._asked, self._asking = key, True
            tg.start_soon(self._ask_turn_model, self.turn_model, key, audio)

    async def _transcribe_early(self, early: _Early, heard: npt.NDArray[np.int16]) -> None:
        started = time.monotonic()
        try:
            early.text = await anyio.to_thread.run_sync(self.stt.transcribe, heard, self.vad.sample_rate)
            early.seconds = time.monotonic() - started
        except Exception as exc:  # the turn's own transcription tries again, and reports it
            self._log.warning("voice.early_transcribe_failed", error=repr(exc))
        finally:
            self._transcribing = False
            early.done.set()
        self._start_ahead(early)
        key = (early.utterance, early.samples)
        if self.text_turn is not None and early.text and self._heard_key() == key:
            try:
                finished = await anyio.to_thread.run_sync(self.text_turn.finished, early.text)
            except Exception as exc:  # a broken model costs only its saving: the silence still ends the turn
                self._log.warning("voice.text_turn_failed", error=repr(exc))
                finished = False
            self._judged(key, "words", finished)

    def _start_ahead(self, early: _Early) -> None:
        """The pause's transcript is ready and the caller is still quiet: answer it now, tentatively."""
        text = " ".join((early.text or "").split())
        room = self.session.rewind_tokens
        if not (self.answer_ahead and room > 0 and text):
            return
        if self._replying is not None or self._next is not None or self._ahead is not None:
            return  # one answer at a time
        if self._heard_key() != (early.utterance, early.samples):
            return  # the caller went on, or the turn ended meanwhile
        engine = self.session.engine
        tokenizer = engine.tokenizer if engine is not None else None
        if tokenizer is not None and len(tokenizer.encode(text)) + MARGIN > room:
            return  # too long a turn to take back: it waits for its end
        self._turns += 1
        turn = _Turn(
            self._turns,
            np.zeros(0, dtype=np.int16),
            speech_end=math.nan,
            heard_at=math.nan,
            early=early,
            ahead=Ahead((early.utterance, early.samples)),
        )
        self._ahead = self._next = turn
        self._heard.set()

    async def _ask_turn_model(self, model: TurnModel, key: tuple[int, int], audio: npt.NDArray[np.int16]) -> None:
        try:
            complete = await anyio.to_thread.run_sync(model.complete, audio)
        except Exception as exc:  # a broken model costs only its saving: the silence still ends the turn
            self._log.warning("voice.turn_model_failed", error=repr(exc))
            complete = False
        finally:
            self._asking = False
        self._judged(key, "sound", complete)

    def _judged(self, key: tuple[int, int], by: str, finished: bool) -> None:
        """A turn model's word on the pause ``key``: the turn ends there once every model given says finished."""
        verdict = self._verdict
        if verdict is None or verdict[0] != key:
            verdict = self._verdict = (key, {})
        verdict[1][by] = finished
        self._end_if_judged()

    def _end_if_judged(self) -> None:
        """End the turn if every turn model given said finished of this very pause, and it has lasted ``pause``."""
        verdict = self._verdict
        if verdict is None or self._heard_key() != verdict[0] or self.vad.pause < self.pause:  # said since, or early
            return
        asked = [m for m, model in (("sound", self.turn_model), ("words", self.text_turn)) if model is not None]
        if asked and all(verdict[1].get(m, False) for m in asked):
            self._end_turn(self.vad.end_turn(), self._last_frame)

    async def _barge_in(self) -> None:
        """The caller speaks over the reply: cut it, so the caller is heard instead."""
        if self.barge_in is None or self.vad.speech_heard < self.barge_in:
            return
        if self._ahead is not None:  # the answer ahead is to this very turn: going on withdraws it, not a cut
            return
        await self.cut_reply()

    async def cut_reply(self) -> bool:
        """Stop the reply under way now, as a barge-in does (``response.cancel`` on the Realtime endpoint).

        The frame being decoded is withdrawn (``Session.interrupt()``), no more of the reply is
        spoken, queued audio is cut on a ``Playback`` transport, and the peer gets an
        ``interrupted`` event. Whether there was a reply to cut.
        """
        turn = self._replying
        decoding = turn is not None and turn.number > self._cut
        playing = isinstance(self.transport, Playback) and self.transport.queued_audio_seconds > 0
        if not (decoding or playing):
            return False
        event: Event = {"type": "interrupted", "decoding": decoding, "playing": playing}
        if turn is not None:
            self._cut = max(self._cut, turn.number)
            if decoding and self._decoding is turn and not self.session.closed:
                # the frame being decoded is withdrawn: the context keeps what the agent received
                cut = self.last_cut = self.session.interrupt()
                event["kept_tokens"] = len(cut.kept)
                event["trimmed"] = cut.trimmed
        if isinstance(self.transport, Playback):
            self.transport.clear_audio()
        self.interruptions += 1
        self._log.info(
            "voice.barge_in", turn=self._cut, decoding=decoding, playing=playing, kept_tokens=event.get("kept_tokens")
        )
        await self.transport.send_event(event)
        return True

    def end_turn(self, utterance: npt.NDArray[np.int16] | None = None, *, text: str | None = None) -> bool:
        """End the caller's turn now, without waiting for a pause (push-to-talk, a typed message).

        ``text``: a typed turn, answered without transcription. ``utterance``: speech (mono
        int16 at ``vad.sample_rate``) heard by other means than the turn detector. Neither: what
        the turn detector has heard of the turn so far. Whether there is a turn to answer.
        """
        if text is not None:
            text = " ".join(text.split())
            if not text:
                return False
            now = time.monotonic()
            self._turns += 1
            self._next = _Turn(self._turns, np.zeros(0, dtype=np.int16), speech_end=now, heard_at=now, text=text)
            self._heard.set()
            return True
        if utterance is None:
            utterance = self.vad.flush()
        elif utterance.size == 0:
            return False
        return self._end_turn(utterance, time.monotonic())

    @property
    def kept_turns(self) -> int:
        """With ``history=False``: turns too long to take back (past ``rewind_tokens``), left in the context."""
        return 0 if self._prompt is None else self._prompt.kept

    @property
    def unspoken(self) -> int:
        """Clauses of replies sent to the voice and not yet handed to the transport as speech."""
        return self._unspoken

    async def _last_word(self) -> None:
        """The caller's audio ended mid-turn: answer that turn, and let the answer play out."""
        if getattr(self.transport, "gone", False):  # the peer hung up: nobody would hear the answer
            return
        while self._failure is None and (self._next is not None or self._replying is not None):
            await anyio.sleep(0.05)
        if isinstance(self.transport, Playback):
            # bounded: a peer that stopped playing (it left) must not hold the session open
            with anyio.move_on_after(self.transport.queued_audio_seconds + 2.0):
                while self._failure is None and self.transport.queued_audio_seconds > 0:
                    await anyio.sleep(0.05)

    def _done_with(self, turn: _Turn) -> None:
        if turn.answered and self._unspoken == 0 and self._replying is turn:
            self._replying = None

    # answering -----------------------------------------------------------------------------------

    async def _reply_loop(self, scope: anyio.CancelScope) -> None:
        try:
            while True:
                await self._heard.wait()
                self._heard = anyio.Event()
                turn, self._next = self._next, None
                if turn is None:
                    continue
                ahead = turn.ahead
                if ahead is not None and not await self._mark(turn, ahead):
                    continue  # withdrawn before it began
                self._replying = turn
                await self._send(turn, {"type": "state", "state": "thinking"})
                # a text turn (Realtime's conversation.item.create) has its words already
                text = " ".join((await self._transcript(turn)).split()) if turn.text is None else turn.text
                turn.transcribed_at = time.monotonic()
                self._log.info(
                    "voice.heard",
                    chars=len(text),
                    seconds=turn.utterance.size / self.vad.sample_rate,
                    ahead=turn.early is not None,
                )
                try:
                    if text and turn.text is not None:
                        await self._answer(turn, text)
                    elif text:
                        await self._send(turn, {"type": "transcript", "role": "user", "text": text, "final": True})
                        await self._answer(turn, text)
                finally:
                    turn.answered = True
                    self._done_with(turn)
                await self._send(turn, {"type": "state", "state": "listening"})
        except MetronomeError as exc:
            self._failure = exc
            scope.cancel()

    async def _mark(self, turn: _Turn, ahead: Ahead) -> bool:
        """Mark the session before a turn answered ahead; whether to answer it (False: it was withdrawn).

        A session that cannot be marked now (a frame of its own still unread) answers the turn
        only once it is confirmed, as a turn not answered ahead.
        """
        if ahead.withdrawn:
            return False
        if self._prompt is not None:  # the context before the turn is the prompt's: its mark serves
            ahead.mark = await self._prompt.before()
        else:
            try:
                ahead.mark = await self.session.mark()
            except ValueError as exc:
                self._log.info("voice.ahead_unmarked", error=str(exc))
        if ahead.mark is None:
            await ahead.settled.wait()
            if ahead.withdrawn:
                return False
        if ahead.withdrawn:
            await self._settle(turn)
            return False
        return True

    async def _send(self, turn: _Turn, event: Event) -> None:
        """An event of ``turn``'s: held back while its answer ahead is not confirmed, dropped if withdrawn."""
        if turn.ahead is None:
            await self.transport.send_event(event)
        elif not turn.ahead.withdrawn:
            await turn.ahead.send(self.transport, event)

    async def _settle(self, turn: _Turn) -> None:
        """The end of an answer ahead: kept when confirmed, the session rewound to its mark when withdrawn."""
        ahead = turn.ahead
        if ahead is None or ahead.mark is None:
            return
        await ahead.settled.wait()  # an answer whole before the turn ended waits for it to end
        mark, ahead.mark = ahead.mark, None
        if self.session.closed:
            return
        if ahead.confirmed:
            if self._prompt is None:  # else the mark stays: the turn goes back to it once answered
                await self.session.keep(mark)
            return
        try:
            await self.session.rewind(mark)
        except RewindUnavailable as exc:  # what was appended stays: the caller's next words follow it
            self._log.warning("voice.ahead_kept", error=str(exc))

    async def _transcript(self, turn: _Turn) -> str:
        early = turn.early
        if early is not None:  # heard ahead: what is left of that transcription is all there is to wait for
            await early.done.wait()
            if early.text is not None:
                self.heard_ahead += 1
                turn.transcribe_seconds = early.seconds
                return early.text
        started = time.monotonic()
        text = await anyio.to_thread.run_sync(self.stt.transcribe, turn.utterance, self.vad.sample_rate)
        turn.transcribe_seconds = time.monotonic() - started
        return text

    async def _answer(self, turn: _Turn, text: str) -> None:
        # the turn goes in ahead of the frame that answers it (Session.append): the frame then
        # carries one token, and its step is a reply frame's, not one as long as the turn
        if self._prompt is not None:
            await self._prompt.before()
        await self.session.append(text)
        self._decoding = turn
        try:
            await self._answer_frames(turn)
        finally:
            self._decoding = None
            await self._settle(turn)
            if self._prompt is not None:
                await self._prompt.after()

    async def _answer_frames(self, turn: _Turn) -> None:
        engine = self.session.engine
        deadline = engine.timing.frame_deadline if engine is not None else math.nan
        reply: list[str] = []
        pending = ""  # reply text not yet sent to the voice
        parts = 0  # clauses sent to the voice
        produced = 0  # tokens: a frame may carry several (decode_tokens)
        stopped = cut = False
        while True:
            await self._on_beat()
            if turn.number <= self._cut:  # cut while the agent was not stepping
                cut = True
                break
            try:
                out = await self.session.step()
            except TurnInterrupted:  # barge-in withdrew this frame: its tokens are not the reply's
                cut = True
                break
            produced += max(1, len(out.tokens))
            stopped = out.stop
            if out.tokens and math.isnan(turn.first_token_at):
                turn.first_token_at = time.monotonic()
            await self._send(turn, frame_event(out, deadline))
            if out.text:
                reply.append(out.text)
                pending += out.text
                await self._send(turn, {"type": "transcript", "role": "assistant", "text": out.text, "final": False})
            cut = turn.number <= self._cut
            last = cut or out.stop or produced >= self.max_reply_tokens
            while not cut and self.speak:  # each clause goes to the voice as soon as it is whole
                end = (
                    len(pending)
                    if last
                    else clause_end(pending, first=parts == 0, min_words=self.clause_words, max_words=self.first_words)
                )
                if end is None or not pending[:end].strip():
                    break
                part, pending = pending[:end].strip(), pending[end:]
                if math.isnan(turn.first_clause_at):
                    turn.first_clause_at = time.monotonic()
                parts += 1
                self._unspoken += 1
                await self._speech_in.send((turn, part))
            if last:
                break
            if parts:
                # the caller waits for the first part's voice, not for the rest of the reply, which has
                # the first part's playing time to decode: the cores are the voice's until it is ready
                await turn.voiced.wait()
            if not await self._go_on(turn, parts):
                cut = True
                break
        answer = " ".join("".join(reply).split())  # one space between words, whatever the deltas carried
        final: Event = {"type": "transcript", "role": "assistant", "text": answer, "final": True}
        if cut:
            final["interrupted"] = True
        await self._send(turn, final)
        self._log.info("voice.answered", tokens=produced, chars=len(answer), stopped=stopped, interrupted=cut)

    async def _go_on(self, turn: _Turn, parts: int) -> bool:
        """Whether to decode on. An answer ahead stops at its first clause (or before its mark's room
        runs out) until the turn's end confirms it; withdrawn, it stops there."""
        ahead = turn.ahead
        if ahead is None or ahead.settled.is_set():
            return not (ahead is not None and ahead.withdrawn)
        mark = ahead.mark
        room = mark.limit - (self.session.stats().num_tokens - mark.num_tokens) if mark is not None else 0
        if parts > 0 or room < self.session.decode_tokens + 1:
            await ahead.settled.wait()
        return not ahead.withdrawn

    async def _on_beat(self) -> None:
        """Wait until ``beat_lead`` before the engine's next tick: the tick that would take a frame sent now.

        Sent at once, a reply's next frame would wait in the queue for most of a period (the
        metronome keeps its phase), its output would come no sooner, and that wait would count
        as frame latency, which admission reads as load.
        """
        engine = self.session.engine
        at = engine.next_tick if engine is not None and self.beat_lead is not None else None
        if at is not None and self.beat_lead is not None:
            delay = at - self.beat_lead - anyio.current_time()
            if delay > 0:
                await anyio.sleep(delay)

    async def _speak_loop(self) -> None:
        async for turn, sentence in self._speech_out:
            try:
                if turn.number > self._cut:
                    await self._speak(turn, sentence)
            finally:
                turn.voiced.set()  # its first part is the first of its parts through here
                self._unspoken -= 1
                self._done_with(turn)

    async def _speak(self, turn: _Turn, sentence: str) -> None:
        # the reply's first part is what the caller waits for: a voice shared with other callers takes it first
        first = math.isnan(turn.synthesized_at)
        voice = self.tts.synthesize_first if first and isinstance(self.tts, SharedVoice) else self.tts.synthesize
        started = time.monotonic()
        try:
            samples, rate = await anyio.to_thread.run_sync(voice, sentence)
            if first:
                turn.synthesize_seconds = time.monotonic() - started
                turn.voiced.set()
        except Exception as exc:  # a broken voice is reported, and the words still went out as text
            self._log.warning("voice.tts_failed", error=repr(exc))
            await self.transport.send_event(error_event(exc))
            return
        if not samples.size or turn.number <= self._cut:  # cut while it was being synthesized
            return
        if turn.ahead is not None:  # answered ahead: its speech waits for the turn's end
            await turn.ahead.settled.wait()
            if turn.number <= self._cut:  # withdrawn (a withdrawal cuts its turn) or cut since
                return
            await turn.ahead.flush(self.transport)
        pcm = pcm16(samples)
        if first:  # the reply's first words: the voice's lead-in quiet only delays them
            turn.synthesized_at = time.monotonic()
            pcm = without_lead(pcm, rate)
        await self.transport.send_audio(pcm, rate)
        if math.isnan(turn.first_synthesis_at):
            turn.first_synthesis_at = now = time.monotonic()
            # each part ends no sooner than the one before it: what was done ahead of the turn's end waited for nothing
            at = [turn.speech_end, turn.heard_at, turn.transcribed_at, turn.first_token_at, turn.first_clause_at]
            at += [turn.synthesized_at, now]
            for i in range(1, len(at)):
                if math.isfinite(at[i - 1]) and math.isfinite(at[i]):
                    at[i] = max(at[i], at[i - 1])
            latency = TurnLatency(
                voice_to_voice=now - turn.speech_end,
                turn_end=at[1] - at[0],
                transcribe=at[2] - at[1],
                first_token=at[3] - at[2],
                first_clause=at[4] - at[3],
                synthesize=at[5] - at[4],
                send=at[6] - at[5],
                ahead=turn.ahead is not None,
                speech_work=turn.transcribe_seconds + turn.synthesize_seconds,
            )
            self.latencies.append(latency)
            if self.on_latency is not None:
                self.on_latency(latency)
            self._log.info("voice.latency", voice_to_voice=latency.voice_to_voice)
            await self.transport.send_event(latency.event())

    async def _stats_loop(self, scope: anyio.CancelScope) -> None:
        while True:
            if self.session.closed:  # closed under us (the engine shut down) while nobody was stepping
                self._failure = SessionClosed(
                    f"session {self.session.id} was closed by its engine", session_id=self.session.id
                )
                scope.cancel()
                return
            event = stats_event(self.session)
            last = self.latencies[-1] if self.latencies else None
            event["voice_to_voice"] = last.voice_to_voice if last is not None else None
            event["turn"] = last.as_dict() if last is not None else None  # where the last answer's time went
            event["interruptions"] = self.interruptions
            await self.transport.send_event(event)
            await anyio.sleep(self.stats_interval)
