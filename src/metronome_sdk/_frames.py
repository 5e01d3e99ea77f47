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

# Bounds on one frame, so that one bad frame cannot make a tick (or the event loop) slow.
# A frame is one tick of input (80 ms by default); these leave room for a long text turn.
MAX_TEXT_CHARS = 32_768
MAX_FRAME_TOKENS = 32_768
MAX_SAMPLE_RATE = 384_000  # Hz: the highest rate audio hardware uses
MAX_AUDIO_SECONDS = 10.0


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
        if self.text is not None:
            _check_text(self.text)
        if self.audio is not None:
            _check_audio(self.audio, self.sample_rate)
        elif self.sample_rate is not None:
            raise ValueError("sample_rate belongs to an audio frame; build one with InputFrame.from_audio")
        if self.tokens is not None:
            if not isinstance(self.tokens, tuple):
                raise ValueError(f"tokens must be a tuple of ints, got {type(self.tokens).__name__}; use from_tokens()")
            if not self.tokens:
                raise ValueError("tokens is empty; send InputFrame.empty() for a tick with no input")
            if len(self.tokens) > MAX_FRAME_TOKENS:
                raise ValueError(
                    f"tokens holds {len(self.tokens)} ids, more than the {MAX_FRAME_TOKENS} one frame may carry; "
                    "send them over several frames"
                )
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
        if isinstance(tokens, str | bytes) or not isinstance(tokens, Iterable):
            raise ValueError(f"tokens must be an iterable of ints, got {type(tokens).__name__}")
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


def _check_text(text: object) -> None:
    if not isinstance(text, str):
        raise ValueError(f"text must be a str, got {type(text).__name__}")
    if len(text) > MAX_TEXT_CHARS:
        raise ValueError(
            f"text holds {len(text)} characters, more than the {MAX_TEXT_CHARS} one frame may carry; "
            "split it over several frames"
        )
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(
            f"text is not valid Unicode: {exc.reason} at index {exc.start}; decode your bytes with errors='replace'"
        ) from None


def _check_audio(audio: object, sample_rate: int | None) -> None:
    if not isinstance(audio, np.ndarray):
        raise ValueError(f"audio must be a numpy array, got {type(audio).__name__}")
    if audio.dtype not in (np.int16, np.float32):
        raise ValueError(f"audio dtype must be int16 or float32 PCM, got {audio.dtype}; convert with .astype()")
    if audio.ndim != 1:
        raise ValueError(f"audio must be mono, one dimension, got shape {audio.shape}; mix channels down first")
    if audio.size == 0:
        raise ValueError("audio holds no samples; send InputFrame.empty() for a tick with no input")
    if isinstance(sample_rate, bool) or not isinstance(sample_rate, int | np.integer) or sample_rate < 1:
        raise ValueError(f"sample_rate must be an int >= 1 (Hz), got {sample_rate!r}; try sample_rate=16000")
    if sample_rate > MAX_SAMPLE_RATE:
        raise ValueError(f"sample_rate must be at most {MAX_SAMPLE_RATE} Hz, got {sample_rate!r}; try 16000")
    if audio.size > MAX_AUDIO_SECONDS * sample_rate:
        raise ValueError(
            f"audio holds {audio.size / sample_rate:.1f} s ({audio.size} samples at {sample_rate} Hz), more than "
            f"the {MAX_AUDIO_SECONDS:g} s one frame may carry; a frame is one tick: split the audio"
        )
    if audio.dtype == np.float32 and not np.isfinite(audio).all():
        bad = int(np.flatnonzero(~np.isfinite(audio))[0])
        raise ValueError(f"audio holds a non-finite sample ({audio[bad]} at index {bad}); float32 PCM lies in [-1, 1]")


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class OutputFrame:
    """The model's output for one input frame.

    ``latency`` is seconds from the frame's submission to this output being ready;
    ``deadline_missed`` says whether that exceeded the deadline. ``stop`` is true when
    the token ends the model's turn. ``tokens`` is never empty: a frame the engine could not
    serve is answered with an error (``EngineStalled``), not with nothing.
    """

    session_id: int
    index: int  # the input frame's number within its session, from 0
    tick: int
    tokens: tuple[int, ...]
    text: str
    latency: float
    deadline_missed: bool
    stop: bool = False
