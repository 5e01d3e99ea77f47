from __future__ import annotations

import shutil
import wave
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from metronome_sdk import Engine
from metronome_sdk.voice import EspeakTTS, PiperTTS, VoiceActivityDetector
from metronome_sdk.webrtc import ServerConfig, WebRTCServer
from tests.sdk.conftest import make_engine

QUESTION = "Hello. What is the capital of France?"


class FixedSTT:
    """Hears the same words in every utterance, and counts the utterances."""

    def __init__(self, text: str = "hello there") -> None:
        self.text = text
        self.heard: list[int] = []

    def transcribe(self, samples: npt.NDArray[np.int16], sample_rate: int) -> str:
        self.heard.append(samples.size)
        return self.text


class ToneTTS:
    """Speaks every sentence as a short 440 Hz tone (no espeak-ng needed)."""

    def __init__(self, seconds: float = 0.4, rate: int = 16000) -> None:
        self.seconds, self.rate = seconds, rate
        self.spoken: list[str] = []

    def synthesize(self, text: str) -> tuple[npt.NDArray[np.int16], int]:
        self.spoken.append(text)
        t = np.arange(round(self.seconds * self.rate)) / self.rate
        return (8000 * np.sin(2 * np.pi * 440 * t)).astype(np.int16), self.rate


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread: None) -> None:
    """Every test here runs on one torch thread (see tests/conftest.py)."""


def speak(text: str, *, voice: str = "piper") -> tuple[npt.NDArray[np.int16], int]:
    """``text`` spoken by Piper's joe voice (the [voice] extra) or espeak-ng (``make test`` installs it)."""
    if voice == "espeak":
        if shutil.which("espeak-ng") is None:
            pytest.fail("espeak-ng is not installed: `make test` installs it (Debian: apt-get install espeak-ng)")
        return EspeakTTS(speed=150).synthesize(text)
    with PiperTTS() as tts:
        return tts.synthesize(text)


def speech_wav(
    path: Path, text: str = QUESTION, *, silence: float = 1.5, lead: float = 0.0, voice: str = "piper"
) -> Path:
    """A recording of ``text`` after ``lead`` and before ``silence`` seconds of quiet (a turn's end; 0 for none)."""
    pcm, rate = speak(text, voice=voice)
    pcm = np.concatenate(
        [np.zeros(round(lead * rate), dtype=np.int16), pcm, np.zeros(round(silence * rate), dtype=np.int16)]
    )
    with wave.open(str(path), "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(pcm.tobytes())
    return path


@pytest.fixture
async def tiny_engine() -> AsyncIterator[Engine]:
    # started, not entered: pytest-asyncio tears a fixture down in another task than set it up
    engine = make_engine(num_blocks=64, limit=4)
    await engine.start()
    yield engine
    await engine.aclose()


def tiny_server(engine: Engine, **config: object) -> WebRTCServer:
    config.setdefault("port", 0)
    config.setdefault("max_reply_tokens", 12)
    # a tone voice and a tiny engine say nothing of what callers would hear: admission on the
    # voice-to-voice objective has its own tests (test_voice_admission.py)
    config.setdefault("voice_objective", None)
    # answering ahead, or taking each turn back (history off), widens each session's bound by 7 blocks:
    # the tiny pool (64) would hold one caller
    config.setdefault("answer_ahead", False)
    config.setdefault("history", True)
    # the callers speak tones, which are speech to loudness (Silero, the default, hears no voice in them)
    server_config = ServerConfig(**config)  # type: ignore[arg-type]
    return WebRTCServer(engine, server_config, stt=FixedSTT(), tts=ToneTTS(), vad=VoiceActivityDetector)
