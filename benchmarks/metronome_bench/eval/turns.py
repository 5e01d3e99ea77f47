"""How well a turn detector knows the caller has finished: the wait it takes, the turns it ends too soon.

No audio is committed: each sentence is spoken at run time, once whole (a complete turn) and
once with a pause in the middle (two phrases, the first ending on a comma, joined by 0.4-0.6 s
of silence: the caller thinks, then goes on). Each policy hears each recording in 20 ms frames,
as a microphone sends them, on a fresh Silero VAD: the fixed silence alone, or a turn model
asked at the first ``pause`` seconds of every pause (its own run time counted in the wait), the
silence ending the turn where the model says not yet. A turn that ends at the mid-sentence pause
is a false end of turn: the agent would answer half a question.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import numpy.typing as npt

from metronome_sdk.voice import SpeechToText, TextToSpeech, TextTurnModel, TurnModel, VoiceActivityDetector, resample

__all__ = ["CHOOSING", "PAUSED", "Policy", "Recording", "TurnResult", "choose_threshold", "record", "run_policy"]

RATE = 16000
FRAME = RATE // 50  # 20 ms

# what a caller asks, split where a speaker may stop to think
PAUSED: tuple[tuple[str, str], ...] = (
    ("What is the capital of", "France?"),
    ("How far away", "is the moon?"),
    ("Tell me a short story", "about a dog."),
    ("What time does the museum", "open tomorrow?"),
    ("Can you recommend a good book", "to read?"),
    ("Why is the sky blue", "during the day?"),
    ("How do I make", "a cup of green tea?"),
    ("Please turn off the lights", "in the kitchen."),
    ("What is the weather like", "in London today?"),
    ("Who wrote the play", "Romeo and Juliet?"),
)
GAPS = (0.4, 0.5, 0.6)  # seconds of silence in the middle, in turn

# the words model's threshold is chosen on these, never on PAUSED (which scores it)
CHOOSING: tuple[tuple[str, str], ...] = (
    ("How many days are there", "in a leap year?"),
    ("What is the tallest mountain", "in the world?"),
    ("Set a timer", "for ten minutes."),
    ("Who painted", "the Mona Lisa?"),
    ("What should I cook", "for dinner tonight?"),
    ("Can you tell me", "a joke?"),
    ("What is the boiling point", "of water?"),
    ("Remind me to call my mother", "at six."),
    ("How do you say hello", "in Spanish?"),
    ("What is the difference between", "a frog and a toad?"),
    ("Play some music", "by the Beatles."),
    ("Where do penguins", "live?"),
    ("Is it going to rain", "this weekend?"),
    ("I would like to book a table", "for two people."),
    ("What are the three primary", "colors?"),
    ("Give me a recipe", "for pancakes."),
    ("How long does it take to", "fly to Tokyo?"),
    ("Which planet is", "closest to the sun?"),
    ("Explain how a rainbow", "is formed."),
    ("What year did the first man", "walk on the moon?"),
)


def choose_threshold(probability: Callable[[str], float]) -> dict[str, Any]:
    """The words model on ``CHOOSING``'s text: each threshold's whole sentences and first phrases read as finished.

    ``best`` is the range of thresholds that separate them best (most whole, fewest first
    phrases: Youden's J), from the probabilities themselves."""
    firsts = [probability(a) for a, _ in CHOOSING]
    wholes = [probability(f"{a} {b}") for a, b in CHOOSING]
    rows = [
        {"first": a, "whole": f"{a} {b}", "p_first": pf, "p_whole": pw}
        for (a, b), pf, pw in zip(CHOOSING, firsts, wholes, strict=True)
    ]
    cuts = sorted(set(firsts) | set(wholes))
    sweep: list[dict[str, float]] = []
    for low, high in zip([0.0, *cuts], [*cuts, 1.0], strict=True):  # every threshold in (low, high) splits alike
        whole = sum(p > low for p in wholes) / len(wholes)
        first = sum(p > low for p in firsts) / len(firsts)
        sweep.append(
            {"above": low, "below": high, "whole_finished": whole, "first_finished": first, "j": whole - first}
        )
    top = max(s["j"] for s in sweep)
    best = [s for s in sweep if s["j"] == top]
    return {
        "sentences": rows,
        "sweep": sweep,
        "best": {"above": best[0]["above"], "below": best[-1]["below"], "j": top},
    }


@dataclass(frozen=True, slots=True)
class Recording:
    """One utterance at 16 kHz, then ``TAIL`` seconds of silence; ``speech_end``: where its speech stops (s)."""

    text: str
    voice: str
    samples: npt.NDArray[np.int16]
    speech_end: float
    gap: float | None  # the mid-sentence pause, None for a whole sentence
    gap_start: float | None = None  # where that pause starts (s)


TAIL = 2.0


def _trimmed(samples: npt.NDArray[np.int16], rate: int) -> npt.NDArray[np.int16]:
    """At 16 kHz, without the synthesizer's quiet before and after the speech."""
    pcm = resample(samples, rate, RATE)
    loud = np.nonzero(np.abs(pcm.astype(np.int32)) > 300)[0]
    return pcm[loud[0] : loud[-1] + 1] if loud.size else pcm


def record(
    voices: Sequence[tuple[str, TextToSpeech]],
    sentences: Sequence[tuple[str, str]] = PAUSED,
    *,
    on_recording: Callable[[], None] | None = None,
) -> list[Recording]:
    """Each sentence (two phrases), by each voice: whole, and with a pause after its first phrase."""
    lead = np.zeros(RATE // 2, dtype=np.int16)
    tail = np.zeros(round(TAIL * RATE), dtype=np.int16)
    out = []
    for name, tts in voices:
        for i, (first, rest) in enumerate(sentences):
            whole = _trimmed(*tts.synthesize(f"{first} {rest}"))
            out.append(
                Recording(
                    f"{first} {rest}", name, np.concatenate([lead, whole, tail]), (lead.size + whole.size) / RATE, None
                )
            )
            a, b = _trimmed(*tts.synthesize(f"{first},")), _trimmed(*tts.synthesize(rest))
            gap = GAPS[i % len(GAPS)]
            silence = np.zeros(round(gap * RATE), dtype=np.int16)
            samples = np.concatenate([lead, a, silence, b, tail])
            end = (lead.size + a.size + silence.size + b.size) / RATE
            out.append(Recording(f"{first} ... {rest}", name, samples, end, gap, (lead.size + a.size) / RATE))
            if on_recording is not None:
                on_recording()
    return out


@dataclass(frozen=True, slots=True)
class Policy:
    """A turn detector: ``vad`` (made fresh for each recording), and the models asked at ``pause`` s.

    ``model`` hears the audio; ``words`` reads what ``stt`` heard up to the pause. Given both, both
    must say finished."""

    name: str
    vad: Callable[[], VoiceActivityDetector]
    model: TurnModel | None = None
    pause: float = 0.2
    words: TextTurnModel | None = None
    stt: SpeechToText | None = None

    def __post_init__(self) -> None:
        if self.words is not None and self.stt is None:
            raise ValueError("a words model reads a transcript: give the policy an stt")

    @property
    def asks(self) -> bool:
        return self.model is not None or self.words is not None


@dataclass(slots=True)
class TurnResult:
    """Where a policy ended the turns of one recording, and what asking its model cost."""

    recording: Recording
    ends: list[float] = field(default_factory=list)  # seconds into the recording
    model_seconds: list[float] = field(default_factory=list)
    asked_at: list[float] = field(default_factory=list)  # seconds into the recording
    probabilities: list[float] = field(default_factory=list)  # where the model tells one (SmartTurn)
    heard: list[str] = field(default_factory=list)  # the transcript at each pause asked (a words model)

    @property
    def false_end(self) -> bool:
        """A turn ended before the caller finished (at the mid-sentence pause)."""
        return any(e < self.recording.speech_end for e in self.ends)

    @property
    def wait(self) -> float | None:
        """Seconds from the end of the speech to the end of the turn that came after it (None: none came)."""
        after = [e for e in self.ends if e >= self.recording.speech_end]
        return after[0] - self.recording.speech_end if after else None


def run_policy(policy: Policy, recording: Recording) -> TurnResult:
    """Hear ``recording`` in 20 ms frames; end turns by the policy's silence and, at each pause, its model."""
    vad = policy.vad()
    result = TurnResult(recording)
    asked: int | None = None  # the speech length the model was last asked about
    delay = 0.0  # the model's run time: the turn it ended ends that much later
    pcm = recording.samples
    for start in range(0, pcm.size - FRAME + 1, FRAME):
        now = (start + FRAME) / RATE
        if vad.push(pcm[start : start + FRAME]):
            result.ends.append(now)
            asked = None
            continue
        if not policy.asks or vad.pause < policy.pause:
            continue
        heard = vad.heard_so_far()
        audio = vad.audio_so_far()
        if heard is None or audio is None or heard.size == asked:
            continue
        asked = heard.size
        complete, delay = True, 0.0
        if policy.model is not None:
            began = time.perf_counter()
            probability = getattr(policy.model, "probability", None)
            if callable(probability):
                p = float(probability(audio))
                complete = p > float(getattr(policy.model, "threshold", 0.5))
                result.probabilities.append(p)
            else:
                complete = policy.model.complete(audio)
            delay = time.perf_counter() - began
        if policy.words is not None and policy.stt is not None:
            began = time.perf_counter()  # the agent transcribes the pause, then reads it
            text = policy.stt.transcribe(heard, RATE)
            finished = bool(text.strip()) and policy.words.finished(text)
            delay = max(delay, time.perf_counter() - began)  # beside the sound model, as the agent runs them
            complete = complete and finished
            result.heard.append(text.strip())
        result.model_seconds.append(delay)
        result.asked_at.append(now)
        if complete:
            vad.end_turn()
            result.ends.append(now + delay)
            asked = None
    return result


def summarize(policy: Policy, results: Sequence[TurnResult]) -> dict[str, Any]:
    """A policy's figures: the wait after whole sentences and paused ones, the false ends, the model's cost."""
    whole = [r for r in results if r.recording.gap is None]
    paused = [r for r in results if r.recording.gap is not None]

    def waits(rs: Sequence[TurnResult]) -> list[float]:
        return [w for r in rs if (w := r.wait) is not None]

    costs = [s for r in results for s in r.model_seconds]
    by_gap = {
        f"{gap:g}": sum(r.false_end for r in paused if r.recording.gap == gap)
        / max(1, sum(r.recording.gap == gap for r in paused))
        for gap in GAPS
    }
    report: dict[str, Any] = {
        "policy": policy.name,
        "pause": policy.pause if policy.asks else None,
        "whole": {
            "recordings": len(whole),
            "wait_median": _median(waits(whole)),
            "wait_mean": _mean(waits(whole)),
            "false_ends": sum(r.false_end for r in whole),
            "no_end": sum(r.wait is None for r in whole),
        },
        "paused": {
            "recordings": len(paused),
            "false_ends": sum(r.false_end for r in paused),
            "false_end_rate": sum(r.false_end for r in paused) / len(paused) if paused else 0.0,
            "false_end_rate_by_gap": by_gap,
            "wait_median": _median(waits(paused)),
        },
        "model_calls": len(costs),
        "model_seconds_median": _median(costs),
        "recordings": [
            {
                "text": r.recording.text,
                "voice": r.recording.voice,
                "gap": r.recording.gap,
                "speech_end": round(r.recording.speech_end, 3),
                "ends": [round(e, 3) for e in r.ends],
                "false_end": r.false_end,
                "asked_at": [round(a, 3) for a in r.asked_at],
                "probabilities": [round(p, 4) for p in r.probabilities],
                "heard": r.heard,
            }
            for r in results
        ],
    }
    if any(r.probabilities for r in results):
        report["thresholds"] = _sweep(whole, paused)
    return report


def _sweep(whole: Sequence[TurnResult], paused: Sequence[TurnResult]) -> list[dict[str, float]]:
    """Other thresholds, from the probabilities heard: whole turns ended at their pause, paused ones cut there."""
    at_end = [r.probabilities[0] for r in whole if r.probabilities]
    # the model's first word on a paused sentence is at its mid-sentence pause
    mid = [
        p
        for r in paused
        for p, a in zip(r.probabilities, r.asked_at, strict=True)
        if r.recording.gap_start is not None and a < r.recording.gap_start + (r.recording.gap or 0.0)
    ]
    return [
        {
            "threshold": t,
            "whole_ended_at_pause": sum(p > t for p in at_end) / max(1, len(at_end)),
            "paused_cut_at_pause": sum(p > t for p in mid) / max(1, len(mid)),
        }
        for t in (0.5, 0.7, 0.9, 0.95, 0.98)
    ]


def _median(values: Sequence[float]) -> float | None:
    return round(statistics.median(values), 4) if values else None


def _mean(values: Sequence[float]) -> float | None:
    return round(statistics.fmean(values), 4) if values else None
