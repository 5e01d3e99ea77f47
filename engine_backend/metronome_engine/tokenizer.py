"""The model's tokenizer and chat template, loaded from the model folder."""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from .weights import resolve_model_dir

__all__ = ["Tokenizer"]


class Tokenizer:
    """Thin wrapper over the Hugging Face tokenizer saved beside the weights."""

    def __init__(self, model: str | os.PathLike[str]) -> None:
        from transformers import AutoTokenizer

        self._tok: Any = AutoTokenizer.from_pretrained(str(resolve_model_dir(model)))
        eos = self._tok.eos_token_id
        im_end = self._tok.convert_tokens_to_ids("<|im_end|>")
        ids = {i for i in (eos, im_end) if isinstance(i, int) and i != self._tok.unk_token_id}
        self.stop_ids: frozenset[int] = frozenset(ids)

    @property
    def vocab_size(self) -> int:
        return len(self._tok)

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int]) -> str:
        return str(self._tok.decode(list(ids), skip_special_tokens=True))

    def chat(self, messages: Sequence[dict[str, str]], *, add_generation_prompt: bool = True) -> list[int]:
        """Token ids of ``messages`` rendered with the model's chat template."""
        text = self._tok.apply_chat_template(
            list(messages), tokenize=False, add_generation_prompt=add_generation_prompt
        )
        return self.encode(str(text))
