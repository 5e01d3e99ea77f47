"""The default voice, for real: Piper's joe voice speaks (out of process), Whisper tiny.en hears, offline."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from typing import Any

import numpy as np
import pytest

from metronome_sdk.voice import PiperTTS, WhisperSTT

pytestmark = pytest.mark.timeout(120)


def words(text: str) -> str:
    return " ".join(re.sub(r"[^a-z0-9' ]", " ", text.lower()).split())


def test_whisper_hears_what_piper_says() -> None:
    with PiperTTS() as tts:
        pcm, rate = tts.synthesize("What is the capital of France?")
    assert rate == 22050 and pcm.dtype == np.int16
    assert 1.0 < pcm.size / rate < 4.0 and np.abs(pcm).max() > 3000  # speech, not silence
    assert words(WhisperSTT().transcribe(pcm, rate)) == "what is the capital of france"


def test_whisper_hears_the_same_in_its_short_window_and_in_the_full_one() -> None:
    from metronome_sdk.voice import EspeakTTS

    # espeak-ng says a sentence the same way every run (Piper's takes vary, and so does what Whisper hears)
    espeak_us = EspeakTTS(voice="en-us", speed=160)
    question = espeak_us.synthesize("What is the largest planet in our solar system?")
    long_text = (
        "My sister moved to a small town near the coast last spring. She works at the library "
        "and walks her dog along the beach every morning. On weekends she bakes bread and sells it at the market."
    )
    espeak = espeak_us.synthesize(long_text)
    assert espeak[0].size / espeak[1] > 10.0  # past the 10 s window: faster-whisper's own path
    short, full = WhisperSTT(), WhisperSTT(window=30)
    assert short.window == 10.0 and "window=10" in repr(short)
    for stt in (short, full):
        assert words(stt.transcribe(*question)) == "what is the largest planet in our solar system"
        heard = words(stt.transcribe(*espeak))
        assert heard.startswith("my sister moved to a small town") and heard.endswith("sells it at the market")


def test_the_servers_default_voice_reads_the_window_it_is_given() -> None:
    from metronome_sdk.voice import EspeakTTS
    from metronome_sdk.voice._default import load_voice

    voice = EspeakTTS(voice="en-us")
    started: list[PiperTTS] = []
    stt, tts = load_voice(None, voice, started, whisper_window=30)
    assert isinstance(stt, WhisperSTT) and stt.window == 30.0
    assert tts is voice and started == []  # the voice given is used, and no Piper was started


def test_whisper_says_at_most_a_callers_worth_of_words_to_noise() -> None:
    # a short window can set tiny.en repeating itself; no reply may run past 10 + 8 a second
    noise = np.random.default_rng(0).normal(0, 3000, 32000).clip(-32768, 32767).astype(np.int16)
    assert len(WhisperSTT().transcribe(noise, 16000).split()) <= 26


def test_whisper_hears_nothing_in_silence() -> None:
    stt = WhisperSTT()
    assert stt.transcribe(np.zeros(0, dtype=np.int16), 16000) == ""
    text = stt.transcribe(np.zeros(16000, dtype=np.int16), 16000)
    assert len(text.split()) <= 2  # Whisper may say "you" to silence; never a sentence


def test_piper_runs_as_its_own_process_and_close_ends_it() -> None:
    # GPL-3.0 piper stays behind a process boundary: the SDK never imports it
    code = (
        "import sys; from metronome_sdk.voice import PiperTTS\n"
        "with PiperTTS() as tts: pcm, rate = tts.synthesize('One. Two.\\nThree.')\n"
        "print(pcm.size > rate, 'piper' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=90, check=True)
    assert out.stdout.split() == ["True", "False"], out.stderr
    tts = PiperTTS()
    tts.load()
    assert "running" in repr(tts)
    tts.close()
    tts.close()  # idempotent
    assert "stopped" in repr(tts)
    pcm, _ = tts.synthesize("again")  # a later call starts it again
    tts.close()
    assert pcm.size > 0
    assert tts.synthesize("  \n ")[0].size == 0  # nothing to say, no process needed


def test_piper_runs_below_this_process_priority() -> None:
    # its ONNX threads spin between sentences: niced, they yield the engine's core
    own = os.getpriority(os.PRIO_PROCESS, 0)
    with PiperTTS() as tts, PiperTTS(nice=0) as same:
        assert tts.pid is None  # not started yet
        tts.load()
        same.load()
        assert tts.pid is not None and same.pid is not None
        assert os.getpriority(os.PRIO_PROCESS, tts.pid) == min(19, own + 10)
        assert os.getpriority(os.PRIO_PROCESS, same.pid) == own
    assert tts.pid is None
    for bad in (-1, 20, 2.5, True):
        with pytest.raises(ValueError, match="nice"):
            PiperTTS(nice=bad)  # type: ignore[arg-type]


def test_the_voices_name_the_fix_when_a_piece_is_missing(tmp_path: object) -> None:
    with pytest.raises(FileNotFoundError, match=r"metronome-sdk\[voice\]"):
        PiperTTS(executable="no-such-piper")
    with pytest.raises(FileNotFoundError, match="no Piper voice"):
        PiperTTS(voice="/no/such/voice.onnx")
    with pytest.raises(FileNotFoundError, match="no Whisper model"):
        WhisperSTT(model="/no/such/folder")
    with pytest.raises(ValueError, match="threads"):
        WhisperSTT(threads=0)
    for bad in (0.5, 31, True, "10", float("nan")):
        with pytest.raises(ValueError, match="window"):
            WhisperSTT(window=bad)  # type: ignore[arg-type]


class _Encoder:
    """faster-whisper's CTranslate2 model, seen through: how many utterances it encodes at once."""

    def __init__(self, model: object) -> None:
        self._model = model
        self.together: threading.Barrier | None = None
        self._lock = threading.Lock()
        self.inside = 0
        self.most = 0

    def encode(self, *args: object, **kwargs: object) -> object:
        with self._lock:
            self.inside += 1
            self.most = max(self.most, self.inside)
        try:
            if self.together is not None:
                self.together.wait()  # both utterances are in the encoder at the same time, or this breaks
            return self._model.encode(*args, **kwargs)  # type: ignore[attr-defined]
        finally:
            with self._lock:
                self.inside -= 1

    def __getattr__(self, name: str) -> object:
        return getattr(self._model, name)


@pytest.mark.parametrize("workers", [1, 2])
def test_whisper_hears_as_many_utterances_at_once_as_it_has_workers(
    workers: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    import faster_whisper

    from metronome_sdk.voice import EspeakTTS

    encoders: list[_Encoder] = []
    load = faster_whisper.WhisperModel.__init__

    def seen_through(model: Any, *args: Any, **kwargs: Any) -> None:  # faster-whisper's, not the project's
        load(model, *args, **kwargs)
        encoders.append(_Encoder(model.model))
        model.model = encoders[-1]

    monkeypatch.setattr(faster_whisper.WhisperModel, "__init__", seen_through)
    question = EspeakTTS(voice="en-us", speed=160).synthesize("What is the largest planet in our solar system?")
    stt = WhisperSTT(workers=workers)
    assert stt.workers == workers and f"workers={workers}" in repr(stt)
    alone = stt.transcribe(*question)
    (encoder,) = encoders
    assert encoder.most == 1
    if workers == 2:
        encoder.together = threading.Barrier(2, timeout=30)
    heard: list[str] = []
    threads = [threading.Thread(target=lambda: heard.append(stt.transcribe(*question))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert heard == [alone, alone]  # side by side, each hears what it heard alone
    assert encoder.most == workers


def test_whisper_refuses_no_workers() -> None:
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="workers must be an int >= 1"):
            WhisperSTT(workers=bad)  # type: ignore[arg-type]


def test_the_servers_default_voice_hears_with_the_workers_it_is_given() -> None:
    from metronome_sdk.voice import EspeakTTS
    from metronome_sdk.voice._default import load_voice

    stt, _ = load_voice(None, EspeakTTS(voice="en-us"), [], whisper_workers=2)
    assert isinstance(stt, WhisperSTT) and stt.workers == 2
