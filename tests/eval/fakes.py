"""A character tokenizer for the tiny random model: enough to drive generation and the dialog."""

from __future__ import annotations

from collections.abc import Sequence

from tests.engine.tiny import VOCAB

STOP = 2


class CharTokenizer:
    """One token per character (code point mod the vocabulary); ``<|im_end|>`` is token 2."""

    stop_ids = frozenset({STOP})

    def encode(self, text: str) -> list[int]:
        out: list[int] = []
        for part in text.split("<|im_end|>"):
            out.extend(3 + ord(c) % (VOCAB - 3) for c in part)
            out.append(STOP)
        return out[:-1]

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(chr(32 + (i - 3) % 95) for i in ids if i != STOP)

    def chat(self, messages: Sequence[dict[str, str]], *, add_generation_prompt: bool = True) -> list[int]:
        text = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
        return self.encode(text + ("<|im_start|>assistant\n" if add_generation_prompt else ""))
