"""The model an eval command runs on: the one ``--model`` names, or a caller's own (``Loader``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from metronome_engine.model import LlamaModel

    from ..eval.generation import ChatTokenizer

__all__ = ["Loader", "load_named"]

# model name or folder -> the model and its tokenizer
Loader = Callable[[str], "tuple[LlamaModel, ChatTokenizer]"]


def load_named(model: str) -> tuple[LlamaModel, ChatTokenizer]:
    """A known model name's or a HF Llama folder's weights (``weights.load_model``) and tokenizer."""
    from metronome_engine.tokenizer import Tokenizer
    from metronome_engine.weights import load_model

    return load_model(model), Tokenizer(model)
