"""The end of a turn by its words: does the transcript so far read as a finished request.

At a short pause the agent already has the words so far (``early_transcribe``). A language
model reads them as the caller's message, its trailing punctuation taken off (Whisper
punctuates a fragment as if it were whole), and says how likely the message ends there: the
probability that the next token closes a sentence or the message. "What is the capital of"
scores near 0, "What is the capital of France" near 1. This is the idea behind LiveKit's
end-of-turn model (a fine-tuned SmolLM2, whose licence allows it only inside LiveKit Agents);
``TextTurn`` runs the engine's own SmolLM2-135M-Instruct, unchanged, on a core of its own.
"""

from __future__ import annotations

import threading
from typing import Any, Protocol, runtime_checkable

__all__ = ["DEFAULT_TEXT_THRESHOLD", "TextTurn", "TextTurnModel"]

# chosen on 20 sentences of its own, split where a speaker might stop (not the eval's): between
# 0.031 and 0.080 every threshold ended 19 of 20 whole ones and 2 of 20 first phrases (docs/voice-agent.md)
DEFAULT_TEXT_THRESHOLD = 0.05
_ENDINGS = ("?", ".", "!", " ?", " .", " !")
MAX_WORDS = 64  # how a message ends is in its last words
_HELD_TOKENS = 192  # a message of MAX_WORDS words and the template's close fit in it


@runtime_checkable
class TextTurnModel(Protocol):
    """Says whether the words heard so far are a finished turn. Called on a worker thread, so it may block."""

    def finished(self, text: str) -> bool: ...


class TextTurn:
    """Whether a transcript ends a turn, by a causal language model's next-token probabilities.

    ``probability(text)`` is the chance that ``text`` (as the user's chat message) ends where it
    stops: the model's probability of a sentence end (``?``, ``.``, ``!``) or of the message's
    end right after it. ``finished`` compares it with ``threshold``. The model (``model``, the
    engine's default SmolLM2-135M-Instruct) loads on first use, or with ``load()``, into an
    ``EngineCore`` of its own (a few seconds), which keeps the chat template before the message
    prefilled, so a call reads only the message's tokens (about 20 ms on a 2-vCPU EPYC, against
    50 ms for the whole prompt). One instance may serve many callers: calls take turns.
    """

    def __init__(self, *, model: str = "smollm2-135m-instruct", threshold: float = DEFAULT_TEXT_THRESHOLD) -> None:
        if isinstance(threshold, bool) or not isinstance(threshold, int | float) or not 0.0 < threshold < 1.0:
            raise ValueError(f"threshold must be a probability in (0, 1), got {threshold!r}; try 0.05")
        self.model = model
        self.threshold = float(threshold)
        self._core: Any = None
        self._tokenizer: Any = None
        self._endings: list[int] = []
        self._prefix: list[int] = []  # the chat template before the message, prefilled once
        self._seq = -1  # the session holding it
        self._lock = threading.Lock()

    def load(self) -> None:
        """Load the model now instead of at the first pause."""
        with self._lock:
            self._load()

    def _load(self) -> None:
        if self._core is not None:
            return
        from metronome_engine import EngineCore, KVPolicy, StepRequest
        from metronome_engine.tokenizer import Tokenizer

        tokenizer = Tokenizer(self.model)
        endings = {ids[0] for ids in map(tokenizer.encode, _ENDINGS) if len(ids) == 1}
        # one message at a time, its last MAX_WORDS words and the chat template: 16 blocks of 16 hold it
        core = EngineCore.from_pretrained(self.model, policy=KVPolicy.full(), num_blocks=16)
        self._tokenizer = tokenizer
        self._endings = sorted(endings | set(tokenizer.stop_ids))
        # the template before the message is the same every time: prefill it once, and after each
        # message go back to it (a hold), so a call reads only the message's own tokens
        self._prefix = self._prompt("")
        self._seq = core.add_sequence()
        core.step([StepRequest(self._seq, self._prefix, sample=False)])
        core.hold(self._seq, _HELD_TOKENS)
        self._core = core

    @property
    def endings(self) -> list[int]:
        """The token ids whose probability says the message ends: sentence ends and the message's end marker."""
        with self._lock:
            self._load()
            return list(self._endings)

    def prompt(self, text: str) -> list[int]:
        """The tokens the model reads: ``text`` as the user's message, left open where it stops."""
        with self._lock:
            self._load()
            return self._prompt(text)

    def _prompt(self, text: str) -> list[int]:
        words = " ".join(text.split()[-MAX_WORDS:]).rstrip(" ?.!,;:")
        ids: list[int] = self._tokenizer.chat([{"role": "user", "content": words}], add_generation_prompt=False)
        stops = self._tokenizer.stop_ids
        closing = max(i for i, t in enumerate(ids) if t in stops)  # the message's end marker, and what follows
        return ids[:closing]

    def probability(self, text: str) -> float:
        if not text.strip():
            raise ValueError("TextTurn needs the words heard so far; got none")
        import torch

        from metronome_engine import StepRequest

        with self._lock:
            self._load()
            core, start = self._core, len(self._prefix)
            ids = self._prompt(text)
            if ids[:start] == self._prefix:
                try:
                    (out,) = core.step([StepRequest(self._seq, ids[start:], return_logits=True)])
                finally:
                    core.rewind(self._seq, start)
            else:  # the message's first token merged with the template's last: read it whole
                seq = core.add_sequence()
                try:
                    (out,) = core.step([StepRequest(seq, ids, return_logits=True)])
                finally:
                    core.free_sequence(seq)
        if out.logits is None:  # the engine dropped the step: its logits were not finite
            raise RuntimeError(f"the model gave no next-token probabilities ({out.stall})")
        p = torch.softmax(out.logits.float(), dim=-1)
        return float(p[self._endings].sum())

    def finished(self, text: str) -> bool:
        return bool(text.strip()) and self.probability(text) > self.threshold

    def __repr__(self) -> str:
        return f"TextTurn(model={self.model!r}, threshold={self.threshold})"
