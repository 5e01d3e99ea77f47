"""Answers worth hearing: the share of short spoken-style questions a system prompt gets answered right.

An answer is right when it holds one of the question's key words (``questions.QUESTIONS``)
and is in English: SmolLM2-135M answers some prompts in French ("Le Grand Paris, la femme
de la France."), which a key word alone ("paris") would count as right. English is judged by
function words: an answer with more French, Spanish or German ones than English ones is not
English. The model decodes greedily, as the demo does, so a run is repeatable.

A call asks several questions in one session (``turns``): with ``history`` the model sees the
call's earlier turns, as ``VoiceAgent(history=True)``; without, each turn is taken back once
answered (``Session.rewind`` to the prompt's mark), as ``VoiceAgent(history=False)``. An answer
*echoes* when its first ``ECHO_WORDS`` words are those of an earlier answer in its call: the
model repeating itself instead of reading the new question.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import anyio

from metronome_sdk import Engine, EngineConfig
from metronome_sdk.webrtc import ServerConfig

from .questions import QUESTIONS, Question

__all__ = ["ECHO_WORDS", "PROMPTS", "Answer", "PromptScore", "ask", "echoes", "is_english", "is_right"]

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
ECHO_WORDS = 4  # "The answer to this" again, not "The capital of" (France, then Italy)


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


def echoes(answer: str, earlier: Sequence[str]) -> bool:
    """The answer's first ``ECHO_WORDS`` words are an earlier answer's (a shorter answer never echoes)."""
    head = _words(answer)[:ECHO_WORDS]
    return len(head) == ECHO_WORDS and any(_words(e)[:ECHO_WORDS] == head for e in earlier)


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
    echo: bool = False  # it repeats an earlier answer of its call

    def as_dict(self) -> dict[str, object]:
        return {
            "prompt": self.prompt,
            "question": self.question,
            "answer": self.answer,
            "tokens": self.tokens,
            "right": self.right,
            "english": self.english,
            "echo": self.echo,
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

    @property
    def echoed(self) -> float:
        return sum(a.echo for a in self.answers) / len(self.answers)

    def as_dict(self) -> dict[str, object]:
        return {
            "prompt": self.prompt,
            "right": self.right,
            "english": self.english,
            "mean_tokens": self.mean_tokens,
            "echoed": self.echoed,
            "answers": [a.as_dict() for a in self.answers],
        }


async def _call(
    engine: Engine,
    prompt: str | None,
    questions: Sequence[Question],
    max_tokens: int,
    history: bool,
    on_answer: Callable[[], None] | None,
) -> list[Answer]:
    """One session asked ``questions`` in turn; without ``history`` each turn is taken back once answered."""
    answers: list[Answer] = []
    rewind = 0 if history else ServerConfig().rewind_tokens  # what the demo's sessions may take back
    async with engine.session(prompt, decode_tokens=4, timeout=600, rewind_tokens=rewind) as session:
        mark = None if history else await session.mark()
        for q in questions:
            await session.append(q.text)
            parts: list[str] = []
            produced = 0
            while produced < max_tokens:
                out = await session.step()
                produced += max(1, len(out.tokens))
                parts.append(out.text)
                if out.stop:
                    break
            if mark is not None:
                await session.rewind(mark)
            text = " ".join("".join(parts).split())
            echo = echoes(text, [a.answer for a in answers])
            answers.append(Answer(prompt, q.text, text, produced, is_right(q, text), is_english(text), echo))
            if on_answer is not None:
                on_answer()
    return answers


async def ask(
    prompts: Sequence[str | None] = PROMPTS,
    questions: Sequence[Question] = QUESTIONS,
    *,
    max_tokens: int = 48,
    config: EngineConfig | None = None,
    at_once: int = 4,
    turns: int = 1,
    history: bool = False,
    on_answer: Callable[[], None] | None = None,
) -> list[PromptScore]:
    """Ask every question under every system prompt (``at_once`` calls at a time), as the demo would:
    ``turns`` questions a call, in order, with or without the call's ``history`` in view."""
    if max_tokens < 1 or at_once < 1 or turns < 1:
        raise ValueError(f"max_tokens, at_once and turns must be >= 1, got {max_tokens}, {at_once} and {turns}")
    calls = [list(questions[i : i + turns]) for i in range(0, len(questions), turns)]
    scores = []
    limit = anyio.Semaphore(at_once)
    async with Engine(config or EngineConfig(kv="window", window=256, sinks=4)) as engine:
        for prompt in prompts:
            answered: list[list[Answer]] = [[] for _ in calls]

            async def one(
                i: int, call: list[Question], prompt: str | None = prompt, answered: list[list[Answer]] = answered
            ) -> None:
                async with limit:
                    answered[i] = await _call(engine, prompt, call, max_tokens, history, on_answer)

            async with anyio.create_task_group() as tg:
                for i, call in enumerate(calls):
                    tg.start_soon(one, i, call)
            scores.append(PromptScore(prompt, tuple(a for answers in answered for a in answers)))
    return scores
