"""The embedded voice: speech in, the session's answer out as speech, by turns.

``SpeechToText`` and ``TextToSpeech`` are one-method protocols, so a better recognizer or
voice plugs in (a voice that callers share may also be a ``SharedVoice``: first parts first).
The default voice (the ``[voice]`` extra) is ``WhisperSTT`` (Whisper tiny.en) and ``PiperTTS``
(Piper's joe voice, run as its own process); ``PocketSphinxSTT`` and ``EspeakTTS`` are the
light alternatives. ``VoiceActivityDetector`` takes turns with a ``SileroClassifier`` (Silero
VAD) or a ``LoudnessClassifier``; ``SmartTurn`` (Pipecat's smart-turn v3) ends a turn at a
short pause when the caller sounds finished, ``TextTurn`` when the words so far read as
finished. ``resample`` brings speech to the rate a recognizer or a transport wants (PyAV).
"""

from .._audio import resample
from ._agent import TurnLatency, VoiceAgent, error_event, stats_event
from ._espeak import EspeakTTS
from ._piper import PiperTTS
from ._pocketsphinx import PocketSphinxSTT
from ._protocols import Playback, SharedVoice, SpeechToText, TextToSpeech
from ._text_turn import TextTurn, TextTurnModel
from ._turn import SmartTurn, TurnModel
from ._vad import (
    LoudnessClassifier,
    SileroClassifier,
    SpeechClassifier,
    VoiceActivityDetector,
    default_turn_detector,
)
from ._whisper import WhisperSTT

__all__ = [
    "EspeakTTS",
    "LoudnessClassifier",
    "PiperTTS",
    "Playback",
    "PocketSphinxSTT",
    "SharedVoice",
    "SileroClassifier",
    "SmartTurn",
    "SpeechClassifier",
    "SpeechToText",
    "TextToSpeech",
    "TextTurn",
    "TextTurnModel",
    "TurnLatency",
    "TurnModel",
    "VoiceActivityDetector",
    "VoiceAgent",
    "WhisperSTT",
    "default_turn_detector",
    "error_event",
    "resample",
    "stats_event",
]
