"""What the voice pipeline needs of speech recognition and synthesis: two one-method protocols.

Both are synchronous and are called on a worker thread, so an implementation may block
(a subprocess, a native decoder, an HTTP call) without stalling the event loop.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

__all__ = ["SpeechToText", "TextToSpeech"]


@runtime_checkable
class SpeechToText(Protocol):
    """Turns one utterance (mono int16 PCM) into text; ``""`` when nothing was understood."""

    def transcribe(self, samples: npt.NDArray[np.int16], sample_rate: int) -> str: ...


@runtime_checkable
class TextToSpeech(Protocol):
    """Turns text into speech: mono int16 PCM and its sample rate."""

    def synthesize(self, text: str) -> tuple[npt.NDArray[np.int16], int]: ...
