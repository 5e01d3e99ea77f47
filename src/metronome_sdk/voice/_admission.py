"""Admission by what callers hear: a new caller only if every caller's reply can still start within the objective.

The engine's admission guards the tick; a voice server also runs speech models, and on a
small CPU they, not the engine, are what callers queue behind (four callers on two cores
waited 4.5-5.9 s for their first reply audio while the tick held its deadline). So the
server asks this too, before it asks the engine.

The model is the turn's critical path (``TurnLatency``) split in two:

- ``speech``: transcribe + synthesize, work the speech models share the cores for. When ``n``
  callers end their turns together, each waits for all ``n`` (worst case, which p95 meets:
  callers' questions come in bursts); so ``speech(n) = n * work``, ``work`` being one turn's
  speech on an otherwise idle machine;
- ``rest``: the turn detector's pause, the engine's first clause, the send (the engine's
  own admission keeps its part bounded).

``predict(n) = unseen + rest + n * work``, ``unseen`` being what the caller waits that the
server's clock cannot see (the turn detector's lag behind the end of speech, the codec and the
caller's jitter buffer: ``WEBRTC_UNSEEN`` for a WebRTC caller; 0 by default). ``work`` starts
from a probe at start-up (``calibrate``) and follows the turns that ran alone; ``rest`` is the
p95 of the recent turns' rest. A caller is admitted when ``predict(callers + 1)`` is within the
objective and the recent turns' p95 is too (feedback on what the model misses: another process
taking a core); before anything is measured (a voice not probed, no turn yet) only the engine's
admission applies. A lone caller is always admitted: on a machine slower than the objective the
server still answers one caller at its best, and says so in its log and ``stats``.
"""

from __future__ import annotations

import math
import statistics
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .._audio import pcm16, resample
from .._core.admission import percentile
from .._exceptions import AdmissionRejected
from .._log import get_logger
from ._protocols import SpeechToText, TextToSpeech

if TYPE_CHECKING:
    from ._agent import TurnLatency

__all__ = ["DEFAULT_OBJECTIVE", "WEBRTC_UNSEEN", "VoiceAdmission", "VoiceTurn", "speech_work"]

# seconds from the end of a caller's speech to its first reply audio, at p95: the upper end of
# what local CPU pipelines are expected to reach (1.2-1.5 s); hosted pipelines aim at 0.8 s
DEFAULT_OBJECTIVE = 1.5
# seconds a WebRTC caller's clock adds to the server's voice to voice: `metronome bench voice` put
# it at 0.23-0.29 s (caller p50 less the server's median) in every run on this project's machine
# since the turn detector's speech ends before its faint tail (0.31-0.39 s before: the server's
# clock started that much later); the least of them, so that admission refuses no more than what was seen
WEBRTC_UNSEEN = 0.23


@dataclass(frozen=True, slots=True)
class VoiceTurn:
    """One answered turn as admission sees it: its voice-to-voice time, the part of it the
    speech models took, and how many calls were open when it ended."""

    voice_to_voice: float
    speech: float
    callers: int
    at: float  # time.monotonic() when it was observed


class VoiceAdmission:
    """Decides whether one more caller fits the voice-to-voice ``objective`` (seconds, p95).

    ``window``: the recent turns the estimates read (and only those newer than ``horizon``
    seconds); ``retry_after``: what a refused caller is told to wait. Thread-safe: turns are
    observed from the agents' tasks, callers admitted from the server's.
    """

    def __init__(
        self,
        objective: float = DEFAULT_OBJECTIVE,
        *,
        unseen: float = 0.0,
        window: int = 32,
        horizon: float = 60.0,
        retry_after: float = 5.0,
    ) -> None:
        for name, value in (("objective", objective), ("horizon", horizon), ("retry_after", retry_after)):
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
                raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")
        if isinstance(window, bool) or not isinstance(window, int) or window < 4:
            raise ValueError(f"window must be an int >= 4 turns, got {window!r}; try 32")
        if isinstance(unseen, bool) or not isinstance(unseen, int | float) or not 0 <= unseen < math.inf:
            raise ValueError(f"unseen must be a finite number of seconds >= 0, got {unseen!r}; try 0")
        self.objective = float(objective)
        self.unseen = float(unseen)
        self.horizon = float(horizon)
        self.retry_after = float(retry_after)
        self._turns: deque[VoiceTurn] = deque(maxlen=window)
        self._probe_work: float | None = None
        self._probe_rest: float | None = None
        self._refused = 0
        self._lock = threading.Lock()
        self._log = get_logger()

    def calibrate(self, *, work: float, rest: float) -> None:
        """The start-up probe: one turn's speech ``work`` on the idle machine (transcribe a
        question, synthesize a clause) and a prior for ``rest`` (the turn detector's pause and
        the engine's first clause), both in seconds; turns observed later take over."""
        for name, value in (("work", work), ("rest", rest)):
            if not 0 <= value < math.inf:
                raise ValueError(f"{name} must be a finite number of seconds >= 0, got {value!r}")
        with self._lock:
            self._probe_work, self._probe_rest = float(work), float(rest)

    def observe(self, *, voice_to_voice: float, speech: float, callers: int) -> None:
        """One answered turn: its voice-to-voice time, the transcribe + synthesize part of it,
        and the calls open when it ended. Non-finite figures (a part that did not happen) are
        not observed."""
        if not (math.isfinite(voice_to_voice) and math.isfinite(speech)) or callers < 1:
            return
        with self._lock:
            self._turns.append(VoiceTurn(voice_to_voice, speech, callers, time.monotonic()))

    def observe_turn(self, latency: TurnLatency, *, callers: int) -> None:
        """``observe`` one answered turn's ``TurnLatency`` (the agent's ``on_latency``): its speech is
        what the recognizer and the voice ran for it (``speech_work``), the transcription done during
        the pause included, since callers whose pauses coincide queue for it; where that is not
        known, the transcribe and synthesize parts."""
        work = latency.speech_work
        speech = work if math.isfinite(work) else latency.transcribe + latency.synthesize
        self.observe(voice_to_voice=latency.voice_to_voice, speech=speech, callers=callers)

    def probe(self, stt: SpeechToText, tts: TextToSpeech, *, rest: float) -> tuple[float, float]:
        """``calibrate`` from ``speech_work`` timed now (call it on the idle machine), with
        ``rest`` as the prior for the rest; the seconds to transcribe and to synthesize."""
        transcribe, synthesize = speech_work(stt, tts)
        self.calibrate(work=transcribe + synthesize, rest=rest)
        return transcribe, synthesize

    def _recent(self) -> list[VoiceTurn]:
        since = time.monotonic() - self.horizon
        return [t for t in self._turns if t.at >= since]

    def _estimates(self) -> tuple[float | None, float | None, float | None]:
        """(work, rest, p95 of the recent turns), each None where nothing says yet; the rest and the
        p95 as the caller waits them (``unseen`` added)."""
        recent = self._recent()
        alone = [t.speech for t in recent if t.callers == 1]
        work = statistics.median(alone) if alone else self._probe_work
        rests = [max(0.0, t.voice_to_voice - t.speech) for t in recent]
        rest = percentile(rests, 0.95) if rests else self._probe_rest
        observed = percentile((t.voice_to_voice for t in recent), 0.95) if recent else None
        if rest is not None:
            rest += self.unseen
        if observed is not None:
            observed += self.unseen
        return work, rest, observed

    def predict(self, callers: int) -> float | None:
        """The voice-to-voice p95 expected with ``callers`` open calls (None: no estimate yet)."""
        with self._lock:
            work, rest, _ = self._estimates()
        if work is None or rest is None:
            return None
        return rest + max(1, callers) * work

    def capacity(self) -> int:
        """How many calls fit the objective by the model now (at least 1: a lone caller is served)."""
        with self._lock:
            work, rest, _ = self._estimates()
        if work is None or rest is None or work <= 0:
            return 1
        return max(1, math.floor((self.objective - rest) / work + 1e-9))

    def admit(self, callers: int) -> None:
        """Admit one more caller beside ``callers`` open ones, or raise ``AdmissionRejected``
        (``limit``: the calls the objective allows; ``in_flight``: ``callers``). With nothing
        measured yet (no probe, no turn) it admits: the engine's admission still applies, and
        the first turns' figures decide from then on."""
        if callers <= 0:
            return  # a lone caller is served at the machine's best
        with self._lock:
            work, rest, observed = self._estimates()
        predicted = None if work is None or rest is None else rest + (callers + 1) * work
        limit = self.capacity()
        why = None
        if observed is not None and observed > self.objective:
            why = f"the recent turns' voice-to-voice p95 is {observed:.2f} s as the callers hear it"
        elif predicted is not None and predicted > self.objective:
            why = f"{callers + 1} calls would reach {predicted:.2f} s"
        if why is None:
            return
        with self._lock:
            self._refused += 1
        self._log.info("voice.admission_rejected", callers=callers, limit=limit, why=why)
        raise AdmissionRejected(
            f"{why}, past the voice-to-voice objective of {self.objective:g} s; retry after {self.retry_after:g} s",
            retry_after=self.retry_after,
            limit=limit,
            in_flight=callers,
        )

    def stats(self) -> dict[str, float | int | None]:
        """The objective, the model's figures and how many callers it refused."""
        with self._lock:
            work, rest, observed = self._estimates()
            turns, refused = len(self._recent()), self._refused
        return {
            "objective_s": self.objective,
            "unseen_s": self.unseen,
            "work_s": work,
            "rest_s": rest,
            "recent_p95_s": observed,
            "recent_turns": turns,
            "capacity": self.capacity(),
            "refused": refused,
        }


def speech_work(
    stt: SpeechToText,
    tts: TextToSpeech,
    *,
    question: str = "What is the capital of France?",
    clause: str = "The capital of France,",
) -> tuple[float, float]:
    """Seconds to transcribe ``question`` (spoken by ``tts`` first, not timed) and to say
    ``clause``: one turn's speech work, for ``VoiceAdmission.calibrate`` on an idle machine."""
    spoken, rate = tts.synthesize(question)
    started = time.perf_counter()
    stt.transcribe(pcm16(resample(spoken, rate, 16000)), 16000)
    heard = time.perf_counter()
    tts.synthesize(clause)
    return heard - started, time.perf_counter() - heard
