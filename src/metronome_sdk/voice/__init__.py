"""The embedded voice: speech in, the session's answer out as speech, by turns.

``SpeechToText`` and ``TextToSpeech`` are one-method protocols, so a better recognizer or
voice plugs in; ``PocketSphinxSTT`` and ``EspeakTTS`` run offline on a laptop.
"""

from ._agent import VoiceAgent, error_event, stats_event
from ._espeak import EspeakTTS
from ._pocketsphinx import PocketSphinxSTT
from ._protocols import SpeechToText, TextToSpeech
from ._vad import VoiceActivityDetector

__all__ = [
    "EspeakTTS",
    "PocketSphinxSTT",
    "SpeechToText",
    "TextToSpeech",
    "VoiceActivityDetector",
    "VoiceAgent",
    "error_event",
    "stats_event",
]
