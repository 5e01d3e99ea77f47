"""Answers worth hearing: the share of short spoken-style questions a system prompt gets answered right.

An answer is right when it holds one of the question's key words (``questions.QUESTIONS``)
and is in English: SmolLM2-135M answers some prompts in French ("Le Grand Paris, la femme
de la France."), which a key word alone ("paris") would count as right. English is judged by
function words: an answer with more French, Spanish or German ones than English ones is not
English. The model decodes greedily, as the demo does, so a run is repeatable.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import anyio

from metronome_sdk import Engine, EngineConfig

from .questions import QUESTIONS, Question

__all__ = ["PROMPTS", "Answer", "PromptScore", "ask", "is_english", "is_right"]

# the system prompts tried by default: the demo's before and after this evaluation, and others
PROMPTS: tuple[str | None, ...] = (
    "You are a friendly voice assistant. Answer in one or two short sentences.",
    "Answer in one sentence.",
    "Answer in one short sentence.",
    "You are a helpful assistant. Answer in one short sentence.",
    "Answer the question in one short English sentence.",
    "Answer the question in one short English sentence. Be factual and direct.",  # the demo's since 2026-12-07
    None,  # the model's own default system prompt (its chat template's)
)

_ENGLISH = frozenset(
    re.findall(
        r"\w+", "the a an is are was of in on and to it that this with for as be by at from has have its they you"
    )
)
# French, Spanish, German function words that are not English words
_OTHER = frozenset(
    re.findall(
        r"\w+",
        "le la les est une des du et dans pour sur avec qui que ce sont il elle el los las es y en con por un una "
        "der die das ist und ein eine mit nicht",
    )
)
_WORD = re.compile(r"[a-zà-ÿ']+")


def _words(text: str) -> list[str]:
    return _WORD.findall(text.lower())


def is_english(text: str) -> bool:
    """More English function words than French, Spanish or German ones (an answer with none of either counts)."""
    words = _words(text)
    english = sum(w in _ENGLISH for w in words)
    other = sum(w in _OTHER and w not in _ENGLISH for w in words)
    return other <= english and not re.search(r"[àâçéèêëîïôûùüÿñœ]", text.lower())


def _plain(text: str) -> str:
    return " ".join(re.sub(r"[^a-z0-9]+", " ", text.lower()).split())


def is_right(question: Question, answer: str) -> bool:
    """The answer holds a key word (as whole words: "eight", "twenty-four", "co2") and is in English."""
    plain = _plain(answer)
    found = any(re.search(rf"\b{re.escape(_plain(k))}\b", plain) for k in question.keys if _plain(k))
    return found and is_english(answer)


@dataclass(frozen=True, slots=True)
class Answer:
    prompt: str | None
    question: str
    answer: str
    tokens: int
    right: bool
    english: bool

    def as_dict(self) -> dict[str, object]:
        return {
            "prompt": self.prompt,
            "question": self.question,
            "answer": self.answer,
            "tokens": self.tokens,
            "right": self.right,
            "english": self.english,
        }


@dataclass(frozen=True, slots=True)
class PromptScore:
    """One system prompt over the questions: the share right, the share in English, the mean reply length."""

    prompt: str | None
    answers: tuple[Answer, ...]

    @property
    def right(self) -> float:
        return sum(a.right for a in self.answers) / len(self.answers)

    @property
    def english(self) -> float:
        return sum(a.english for a in self.answers) / len(self.answers)

    @property
    def mean_tokens(self) -> float:
        return sum(a.tokens for a in self.answers) / len(self.answers)

    def as_dict(self) -> dict[str, object]:
        return {
            "prompt": self.prompt,
            "right": self.right,
            "english": self.english,
            "mean_tokens": self.mean_tokens,
            "answers": [a.as_dict() for a in self.answers],
        }


async def _answer(engine: Engine, prompt: str | None, q: Question, max_tokens: int) -> Answer:
    async with engine.session(prompt, decode_tokens=4, timeout=600) as session:
        await session.append(q.text)
        parts: list[str] = []
        produced = 0
        while produced < max_tokens:
            out = await session.step()
            produced += max(1, len(out.tokens))
            parts.append(out.text)
            if out.stop:
                break
    text = " ".join("".join(parts).split())
    return Answer(prompt, q.text, text, produced, is_right(q, text), is_english(text))


async def ask(
    prompts: Sequence[str | None] = PROMPTS,
    questions: Sequence[Question] = QUESTIONS,
    *,
    max_tokens: int = 48,
    config: EngineConfig | None = None,
    at_once: int = 4,
    on_answer: Callable[[], None] | None = None,
) -> list[PromptScore]:
    """Ask every question under every system prompt (``at_once`` sessions at a time), as the demo would."""
    if max_tokens < 1 or at_once < 1:
        raise ValueError(f"max_tokens and at_once must be >= 1, got {max_tokens} and {at_once}")
    scores = []
    limit = anyio.Semaphore(at_once)
    async with Engine(config or EngineConfig(kv="window", window=256, sinks=4)) as engine:
        for prompt in prompts:
            answers: list[Answer | None] = [None] * len(questions)

            async def one(
                i: int, q: Question, prompt: str | None = prompt, answers: list[Answer | None] = answers
            ) -> None:
                async with limit:
                    answers[i] = await _answer(engine, prompt, q, max_tokens)
                if on_answer is not None:
                    on_answer()

            async with anyio.create_task_group() as tg:
                for i, q in enumerate(questions):
                    tg.start_soon(one, i, q)
            scores.append(PromptScore(prompt, tuple(a for a in answers if a is not None)))
    return scores
