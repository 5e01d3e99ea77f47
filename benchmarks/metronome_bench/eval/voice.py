"""How well a recognizer hears: word error rate on prompts spoken at run time by voices nobody tuned for.

No audio is committed: each prompt is spoken by each voice (Piper's joe voice, espeak-ng's
American and British English) when the evaluation runs, and each recognizer transcribes it.
The word error rate is the words substituted, deleted and inserted over the words said,
after lower-casing and dropping punctuation.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from metronome_sdk.voice import SpeechToText, TextToSpeech

__all__ = ["PROMPTS", "WordErrors", "measure", "measure_each", "normalize", "word_errors"]

# what a caller says to a voice assistant: questions and requests, 4 to 9 words
PROMPTS: tuple[str, ...] = (
    "What is the capital of France?",
    "How far away is the moon?",
    "Tell me a short story about a dog.",
    "What time does the museum open tomorrow?",
    "Can you recommend a good book to read?",
    "Why is the sky blue during the day?",
    "How do I make a cup of green tea?",
    "Please turn off the lights in the kitchen.",
    "What is the weather like in London today?",
    "Who wrote the play Romeo and Juliet?",
)

_SPELLED = {"mr": "mister", "mrs": "missus", "dr": "doctor", "ok": "okay"}


def normalize(text: str) -> list[str]:
    """Lower-case words without punctuation ("Juliet?" -> "juliet"; "don't" stays one word)."""
    words = re.sub(r"[^a-z0-9' ]+", " ", text.lower().replace("-", " ")).split()
    return [_SPELLED.get(w.strip("'"), w.strip("'")) for w in words if w.strip("'")]


def word_errors(reference: str, heard: str) -> int:
    """Substitutions + deletions + insertions that turn ``reference`` into ``heard`` (word Levenshtein)."""
    ref, hyp = normalize(reference), normalize(heard)
    row = list(range(len(hyp) + 1))
    for i, r in enumerate(ref, 1):
        prev, row[0] = row[0], i
        for j, h in enumerate(hyp, 1):
            prev, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, prev + (r != h))
    return row[-1]


@dataclass(frozen=True, slots=True)
class WordErrors:
    """One recognizer on one voice's prompts: ``errors`` over ``words`` said; ``wer`` their ratio.

    ``real_time``: seconds spent transcribing over seconds of speech (below 1: faster than spoken).
    ``worst`` is the prompt with the most errors and what was heard for it.
    """

    recognizer: str
    voice: str
    prompts: int
    words: int
    errors: int
    real_time: float
    worst: tuple[str, str]

    @property
    def wer(self) -> float:
        return self.errors / self.words if self.words else 0.0

    def as_dict(self) -> dict[str, object]:
        return {
            "recognizer": self.recognizer,
            "voice": self.voice,
            "prompts": self.prompts,
            "words": self.words,
            "errors": self.errors,
            "wer": self.wer,
            "real_time": self.real_time,
            "worst": {"said": self.worst[0], "heard": self.worst[1]},
        }


def measure(
    recognizer: tuple[str, SpeechToText],
    voice: tuple[str, TextToSpeech],
    prompts: Sequence[str] = PROMPTS,
    *,
    on_prompt: Callable[[], None] | None = None,
) -> WordErrors:
    """Speak each prompt with ``voice``, transcribe it with ``recognizer``, count the word errors."""
    return measure_each([recognizer], voice, prompts, on_prompt=on_prompt)[0]


def measure_each(
    recognizers: Sequence[tuple[str, SpeechToText]],
    voice: tuple[str, TextToSpeech],
    prompts: Sequence[str] = PROMPTS,
    *,
    on_prompt: Callable[[], None] | None = None,
) -> list[WordErrors]:
    """Speak each prompt once with ``voice`` and let every recognizer hear the same take.

    Piper's takes of one sentence differ from run to run; one take for all keeps their
    comparison about the recognizers. ``on_prompt`` is called once per prompt heard.
    """
    voice_name, tts = voice
    said = [(prompt, *tts.synthesize(prompt)) for prompt in prompts]
    results = []
    for stt_name, stt in recognizers:
        words = errors = 0
        spoken = busy = 0.0
        worst = ("", "")
        worst_errors = -1
        for prompt, samples, rate in said:
            start = time.perf_counter()
            heard = stt.transcribe(samples, rate)
            busy += time.perf_counter() - start
            spoken += samples.size / rate
            wrong = word_errors(prompt, heard)
            words += len(normalize(prompt))
            errors += wrong
            if wrong > worst_errors:
                worst, worst_errors = (prompt, heard), wrong
            if on_prompt is not None:
                on_prompt()
        real_time = busy / spoken if spoken else 0.0
        results.append(WordErrors(stt_name, voice_name, len(prompts), words, errors, real_time, worst))
    return results
