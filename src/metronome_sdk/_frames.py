"""Frames: what a session sends each tick and what it gets back.

An input frame carries text, audio (PCM as int16 or float32 numpy arrays with a
sample rate), token ids, or nothing (a tick where nothing new was heard: the model
keeps talking). An output frame carries the tokens decoded for one input frame.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

__all__ = ["InputFrame", "OutputFrame"]


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class InputFrame:
    """One tick of input. Build it with ``from_text``, ``from_audio``, ``from_tokens`` or ``empty``."""

    text: str | None = None
    audio: npt.NDArray[Any] | None = None
    sample_rate: int | None = None
    tokens: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        given = [name for name in ("text", "audio", "tokens") if getattr(self, name) is not None]
        if len(given) > 1:
            raise ValueError(f"an input frame carries one of text, audio or tokens, got {given}; send them apart")
        if self.text is not None and not isinstance(self.text, str):
            raise ValueError(f"text must be a str, got {type(self.text).__name__}")
        if self.audio is not None:
            _check_audio(self.audio, self.sample_rate)
        elif self.sample_rate is not None:
            raise ValueError("sample_rate belongs to an audio frame; build one with InputFrame.from_audio")
        if self.tokens is not None:
            if not self.tokens:
                raise ValueError("tokens is empty; send InputFrame.empty() for a tick with no input")
            for t in self.tokens:
                if isinstance(t, bool) or not isinstance(t, int) or t < 0:
                    raise ValueError(f"tokens holds {t!r}; token ids are ints >= 0")

    @classmethod
    def from_text(cls, text: str) -> InputFrame:
        return cls(text=text)

    @classmethod
    def from_audio(cls, samples: npt.NDArray[Any], *, sample_rate: int) -> InputFrame:
        """Mono PCM: int16, or float32 in ``[-1, 1]``."""
        return cls(audio=samples, sample_rate=sample_rate)

    @classmethod
    def from_tokens(cls, tokens: Iterable[int]) -> InputFrame:
        return cls(tokens=tuple(tokens))

    @classmethod
    def empty(cls) -> InputFrame:
        """A tick with no new input: the session appends its last output and decodes on."""
        return cls()

    @property
    def kind(self) -> Literal["text", "audio", "tokens", "empty"]:
        if self.text is not None:
            return "text"
        if self.audio is not None:
            return "audio"
        if self.tokens is not None:
            return "tokens"
        return "empty"

    def samples_float32(self) -> npt.NDArray[np.float32]:
        """The audio as float32 in ``[-1, 1]`` (int16 is scaled by 1/32768)."""
        if self.audio is None:
            raise ValueError("this frame carries no audio")
        if self.audio.dtype == np.int16:
            return (self.audio.astype(np.float32) / 32768.0).astype(np.float32)
        return np.asarray(self.audio, dtype=np.float32)

    def __repr__(self) -> str:
        if self.text is not None:
            return f"InputFrame.from_text({self.text!r})"
        if self.audio is not None:
            return (
                f"InputFrame.from_audio(<{self.audio.size} {self.audio.dtype} samples>, sample_rate={self.sample_rate})"
            )
        if self.tokens is not None:
            return f"InputFrame.from_tokens({list(self.tokens)!r})"
        return "InputFrame.empty()"


def _check_audio(audio: object, sample_rate: int | None) -> None:
    if not isinstance(audio, np.ndarray):
        raise ValueError(f"audio must be a numpy array, got {type(audio).__name__}")
    if audio.dtype not in (np.int16, np.float32):
        raise ValueError(f"audio dtype must be int16 or float32 PCM, got {audio.dtype}; convert with .astype()")
    if audio.ndim != 1:
        raise ValueError(f"audio must be mono, one dimension, got shape {audio.shape}; mix channels down first")
    if audio.size == 0:
        raise ValueError("audio holds no samples; send InputFrame.empty() for a tick with no input")
    if isinstance(sample_rate, bool) or not isinstance(sample_rate, int) or sample_rate < 1:
        raise ValueError(f"sample_rate must be an int >= 1 (Hz), got {sample_rate!r}; try sample_rate=16000")


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class OutputFrame:
    """The model's output for one input frame.

    ``latency`` is seconds from the frame's submission to this output being ready;
    ``deadline_missed`` says whether that exceeded the deadline. ``stop`` is true when
    the token ends the model's turn. ``tokens`` is empty only in the legacy ``silent``
    mode, where a stalled frame is answered on time with nothing.
    """

    session_id: int
    index: int  # the input frame's number within its session, from 0
    tick: int
    tokens: tuple[int, ...]
    text: str
    latency: float
    deadline_missed: bool
    stop: bool = False
    audio: npt.NDArray[np.float32] | None = None

    @property
    def empty(self) -> bool:
        return not self.tokens
