"""A scripted turn-based dialog that runs long past the window, with an automatic check.

Each user turn carries a passage to read and a new secret word, and asks for that word:
a fact given in the current turn, which a window of W tokens still holds if the turn fits
in it. The last turn asks for the first turn's word, long evicted under a window: reported,
not checked. Turns use ChatML, SmolLM2's chat template.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from metronome_engine import EngineCore, KVPolicy, StepRequest
from metronome_engine.model import LlamaModel

from .generation import ChatTokenizer
from .perplexity import engine_for_stream

__all__ = ["DialogAnswer", "DialogRun", "SECRET_WORDS", "run_dialog", "turn_messages"]

SECRET_WORDS = (
    "falcon", "copper", "violet", "harbor", "maple", "quartz", "lantern", "saffron",
    "glacier", "meadow", "cobalt", "orchid", "thunder", "pebble", "juniper", "canyon",
)  # fmt: skip
SYSTEM = "You are a helpful assistant. Answer briefly."
_CHUNK = 128


@dataclass(frozen=True, slots=True)
class DialogAnswer:
    question: str
    expected: str
    answer: str
    checked: bool  # counts toward the score (a current-turn fact)

    @property
    def correct(self) -> bool:
        return self.expected.lower() in self.answer.lower()


@dataclass(frozen=True, slots=True)
class DialogRun:
    policy: KVPolicy
    answers: list[DialogAnswer]
    tokens: int  # tokens in the session at the end

    @property
    def score(self) -> tuple[int, int]:
        checked = [a for a in self.answers if a.checked]
        return sum(a.correct for a in checked), len(checked)


def turn_messages(passages: Sequence[str]) -> list[tuple[str, str, bool]]:
    """``(user message, expected word, checked)`` for each turn, then the recall question."""
    if not 1 <= len(passages) <= len(SECRET_WORDS):
        raise ValueError(f"the dialog takes 1 to {len(SECRET_WORDS)} passages, got {len(passages)}")
    turns = []
    for passage, word in zip(passages, SECRET_WORDS, strict=False):
        msg = (
            f"Read this passage:\n\n{passage.strip()}\n\n"
            f"Now remember: the secret word is {word}. What is the secret word? Reply with the word only."
        )
        turns.append((msg, word, True))
    turns.append(("What was the secret word in my first message? Reply with the word only.", SECRET_WORDS[0], False))
    return turns


def run_dialog(
    model: LlamaModel,
    tokenizer: ChatTokenizer,
    policy: KVPolicy,
    passages: Sequence[str],
    *,
    max_answer_tokens: int = 16,
    progress: Callable[[int], None] | None = None,
) -> DialogRun:
    """Play the script under ``policy`` in one session; answers are greedy."""
    turns = turn_messages(passages)
    budget = sum(len(tokenizer.encode(m)) + 16 + max_answer_tokens for m, _, _ in turns) + 64
    engine = engine_for_stream(model, policy, budget, chunk=_CHUNK)
    seq = engine.add_sequence()
    answers: list[DialogAnswer] = []
    pending: list[int] = []  # the last answer's final token, sampled but not yet fed
    try:
        for k, (msg, word, checked) in enumerate(turns):
            if k == 0:
                prompt = tokenizer.chat([{"role": "system", "content": SYSTEM}, {"role": "user", "content": msg}])
            else:
                prompt = pending + tokenizer.encode(
                    f"<|im_end|>\n<|im_start|>user\n{msg}<|im_end|>\n<|im_start|>assistant\n"
                )
            reply = _answer(engine, seq, prompt, tokenizer.stop_ids, max_answer_tokens)
            ended = bool(reply) and reply[-1] in tokenizer.stop_ids
            pending = [] if ended else reply[-1:]
            answers.append(DialogAnswer(msg, word, tokenizer.decode(reply).strip(), checked))
            if progress is not None:
                progress(1)
        tokens = engine.sequence_length(seq)
    finally:
        engine.free_sequence(seq)
    return DialogRun(policy, answers, tokens)


def _answer(engine: EngineCore, seq: int, prompt: list[int], stop: frozenset[int], limit: int) -> list[int]:
    """Feed ``prompt`` then decode greedily; the reply ends with a stop token or at ``limit``."""
    reply: list[int] = []
    feed = [prompt[i : i + _CHUNK] for i in range(0, len(prompt), _CHUNK)]
    while True:
        piece = feed.pop(0) if feed else reply[-1:]
        out = engine.step([StepRequest(seq, piece, sample=not feed)])[0]
        if not out.ok:
            raise RuntimeError(f"the dialog's engine stalled ({out.stall}); its pool is sized too small")
        if feed:
            continue
        if out.token is None:
            raise RuntimeError("the engine returned no token for a sampling step")
        reply.append(out.token)
        if out.token in stop or len(reply) >= limit:
            return reply
