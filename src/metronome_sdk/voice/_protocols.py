"""What the voice pipeline needs of speech recognition and synthesis: two one-method protocols.

Both are synchronous and are called on a worker thread, so an implementation may block
(a subprocess, a native decoder, an HTTP call) without stalling the event loop.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

__all__ = ["Playback", "SharedVoice", "SpeechToText", "TextToSpeech"]


@runtime_checkable
class SpeechToText(Protocol):
    """Turns one utterance (mono int16 PCM) into text; ``""`` when nothing was understood."""

    def transcribe(self, samples: npt.NDArray[np.int16], sample_rate: int) -> str: ...


@runtime_checkable
class TextToSpeech(Protocol):
    """Turns text into speech: mono int16 PCM and its sample rate."""

    def synthesize(self, text: str) -> tuple[npt.NDArray[np.int16], int]: ...


@runtime_checkable
class SharedVoice(Protocol):
    """A voice several callers share (``PiperTTS``: one process): a reply's first part goes first.

    A ``VoiceAgent`` calls ``synthesize_first`` for each reply's first part, where the voice has
    it: that part is what the caller waits for, while another caller's later sentences have
    until the audio ahead of them has played.
    """

    def synthesize_first(self, text: str) -> tuple[npt.NDArray[np.int16], int]: ...


@runtime_checkable
class Playback(Protocol):
    """A transport that plays speech in real time (``WebRTCPeer``): how much is still to play, and a cut.

    A ``VoiceAgent`` uses it, where the transport has it, to cut the reply when the caller
    speaks over it (barge-in), and to let the last answer play out before it hangs up.
    """

    @property
    def queued_audio_seconds(self) -> float: ...

    def clear_audio(self) -> None: ...
