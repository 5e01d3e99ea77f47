"""The default voice, loaded for a server: Whisper tiny.en in, Piper's joe voice out (the ``[voice]`` extra)."""

from __future__ import annotations

from ._piper import PiperTTS
from ._protocols import SpeechToText, TextToSpeech
from ._text_turn import TextTurn, TextTurnModel
from ._whisper import DEFAULT_WINDOW, SERVER_WORKERS, WhisperSTT

__all__: list[str] = []  # internal: load_voice and load_words, for the WebRTC server and `metronome serve`


def load_voice(
    stt: SpeechToText | None,
    tts: TextToSpeech | None,
    started: list[PiperTTS],
    *,
    whisper_window: float = DEFAULT_WINDOW,
    whisper_workers: int = SERVER_WORKERS,
) -> tuple[SpeechToText, TextToSpeech]:
    """``stt`` and ``tts``, each loaded by default where ``None`` (Whisper reading ``whisper_window``
    seconds, ``whisper_workers`` utterances at once); a Piper voice started here goes in ``started``,
    for its owner to close (its own process). Blocking: call it on a worker thread."""
    if stt is None:
        whisper = WhisperSTT(window=whisper_window, workers=whisper_workers)
        whisper.load()
        stt = whisper
    if tts is None:
        piper = PiperTTS()
        started.append(piper)
        piper.load()
        tts = piper
    return stt, tts


def load_words(given: TextTurnModel | None, *, wanted: bool) -> TextTurnModel | None:
    """The words model a server's agents ask at a pause: ``given``, else ``TextTurn`` loaded where
    ``wanted`` (a server loads it beside its default voice). Blocking: call it on a worker thread."""
    if given is not None or not wanted:
        return given
    words = TextTurn()
    words.load()
    return words
