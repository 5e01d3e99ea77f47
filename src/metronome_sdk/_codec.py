"""Frame codecs: how input frames become the tokens a session appends.

Audio goes through a ``FrameCodec`` the application names (``Engine(codec=...)``; there is
no default, since a text model has no audio tokens). ``FixedRateCodec`` turns every frame
into the same number of tokens, so each session's KV grows at a constant rate per second,
as an interaction model's audio frames do (Moshi: 12.5 Hz, a few tokens each).
Text goes through the model's tokenizer and chat template.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

__all__ = ["FixedRateCodec", "FrameCodec", "TextTokenizer"]


@runtime_checkable
class FrameCodec(Protocol):
    """Turns one mono audio frame (float32 in ``[-1, 1]``) into token ids."""

    def encode(self, samples: npt.NDArray[np.float32], sample_rate: int) -> Sequence[int]: ...


class FixedRateCodec:
    """``tokens_per_frame`` tokens per frame, whatever its length: a constant KV growth rate.

    Each token is the loudness of one slice of the frame, quantized to ``levels`` ids
    starting at ``first_id``. A stand-in for a neural audio codec: it carries the load
    of audio, not its meaning.
    """

    def __init__(self, *, tokens_per_frame: int = 8, levels: int = 32, first_id: int = 32) -> None:
        if isinstance(tokens_per_frame, bool) or not isinstance(tokens_per_frame, int) or tokens_per_frame < 1:
            raise ValueError(f"tokens_per_frame must be an int >= 1, got {tokens_per_frame!r}; try 8")
        if isinstance(levels, bool) or not isinstance(levels, int) or levels < 2:
            raise ValueError(f"levels must be an int >= 2, got {levels!r}; try 32")
        if isinstance(first_id, bool) or not isinstance(first_id, int) or first_id < 0:
            raise ValueError(f"first_id must be an int >= 0, got {first_id!r}")
        self.tokens_per_frame = tokens_per_frame
        self.levels = levels
        self.first_id = first_id

    def encode(self, samples: npt.NDArray[np.float32], sample_rate: int) -> list[int]:
        ids = []
        for part in np.array_split(samples, self.tokens_per_frame):
            rms = float(np.sqrt(np.mean(np.square(part, dtype=np.float64)))) if part.size else 0.0
            db = 20.0 * np.log10(max(rms, 1e-5))  # -100 dBFS .. 0 dBFS
            level = int(np.clip((db + 100.0) / 100.0 * (self.levels - 1), 0, self.levels - 1))
            ids.append(self.first_id + level)
        return ids

    def __repr__(self) -> str:
        return (
            f"FixedRateCodec(tokens_per_frame={self.tokens_per_frame}, levels={self.levels}, first_id={self.first_id})"
        )


@runtime_checkable
class TextTokenizer(Protocol):
    """What a session needs of a tokenizer (``metronome_engine.tokenizer.Tokenizer`` fits)."""

    stop_ids: frozenset[int]

    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def chat(self, messages: Sequence[dict[str, str]], *, add_generation_prompt: bool = True) -> list[int]: ...


def chat_turn(tokenizer: TextTokenizer, role: str, text: str, *, first: bool, generation_prompt: bool) -> list[int]:
    """Tokens of one chat turn.

    The first turn of a session is the template's whole rendering (with its preamble,
    such as a default system prompt); a later turn is only what it adds, found by
    rendering with and without it behind a fixed anchor.
    """
    turn = [{"role": role, "content": text}]
    if first:
        return tokenizer.chat(turn, add_generation_prompt=generation_prompt)
    anchor = [{"role": "system", "content": "."}]
    before = tokenizer.chat(anchor, add_generation_prompt=False)
    full = tokenizer.chat(anchor + turn, add_generation_prompt=generation_prompt)
    if full[: len(before)] != before:  # a template that rewrites earlier turns: send the turn alone
        return tokenizer.encode(text)
    return full[len(before) :]
