"""The end of a turn by meaning: has the caller finished, judged from the sound of the utterance so far.

A pause alone cannot tell "What is the capital of... France?" from "What is the capital of
France?": both stop for half a second. Pipecat's smart-turn v3 (BSD-2-Clause, an ONNX model
inside the ``pipecat-ai`` wheel, the ``[pipecat]`` extra) hears the last 8 s of the turn, words and intonation, and says
how likely the caller is done. ``SmartTurn`` runs it with onnxruntime on Whisper's log-mel
features (faster-whisper computes them, the same as transformers' ``WhisperFeatureExtractor``
with an 8 s chunk); a ``VoiceAgent`` asks it after a short pause and ends the turn when it says
complete, else waits for its turn detector's silence.
"""

from __future__ import annotations

import importlib.util
import threading
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

__all__ = ["SmartTurn", "TurnModel", "bundled_smart_turn_model"]

_MODEL = "smart-turn-v3.2-cpu.onnx"


@runtime_checkable
class TurnModel(Protocol):
    """Says whether a turn is complete from its audio so far (mono int16 at ``sample_rate``, the pause included).

    Called on a worker thread, so it may block.
    """

    sample_rate: int

    def complete(self, samples: npt.NDArray[np.int16]) -> bool: ...


def bundled_smart_turn_model() -> Path:
    """smart-turn v3.2 for CPUs, as the ``pipecat-ai`` wheel ships it."""
    # found, not imported: importing pipecat would start its logging
    try:
        spec = importlib.util.find_spec("pipecat")
    except (ImportError, ValueError):  # ValueError: a module without a spec (set to None: not installed)
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(
            "smart-turn's model ships in the pipecat-ai wheel: pip install 'metronome-sdk[voice,pipecat]'"
        )
    return Path(next(iter(spec.submodule_search_locations))) / "audio" / "turn" / "smart_turn" / "data" / _MODEL


class SmartTurn:
    """Whether a turn is complete, by smart-turn v3 on its last ``seconds`` (8) of audio at 16 kHz.

    ``probability(samples)`` is the model's probability that the caller has finished, given the
    turn's audio so far (mono int16 at 16 kHz, the pause after the speech included); ``complete``
    compares it with ``threshold``. Shorter audio is padded with silence in front, longer audio
    keeps its last ``seconds``. ``model`` is an ONNX file (by default the one inside
    ``pipecat-ai``); it loads on first use, or with ``load()``, and runs on ``threads`` CPU
    threads: about 70 ms a call on one core of a 2-vCPU EPYC. One instance may serve many
    callers: calls take turns.
    """

    sample_rate = 16000
    seconds = 8

    def __init__(self, *, model: str | Path | None = None, threshold: float = 0.5, threads: int = 1) -> None:
        if not 0.0 < threshold < 1.0:
            raise ValueError(f"threshold must be a probability in (0, 1), got {threshold!r}; try 0.5")
        if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
            raise ValueError(f"threads must be an int >= 1, got {threads!r}; try 1")
        self.model = Path(model) if model is not None else bundled_smart_turn_model()
        if not self.model.is_file():
            raise FileNotFoundError(f"no smart-turn ONNX model at {self.model}")
        self.threshold = threshold
        self.threads = threads
        self._session: Any = None
        self._features: Any = None
        self._lock = threading.Lock()

    def load(self) -> None:
        """Load the model now (a few tenths of a second) instead of on the first pause."""
        with self._lock:
            self._load()

    def _load(self) -> Any:
        if self._session is None:
            try:
                import onnxruntime as ort
                from faster_whisper.feature_extractor import FeatureExtractor
            except ImportError as exc:
                raise ImportError(
                    "SmartTurn needs onnxruntime and faster-whisper: pip install 'metronome-sdk[voice]'"
                ) from exc
            options = ort.SessionOptions()
            options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
            options.inter_op_num_threads = 1
            options.intra_op_num_threads = self.threads
            self._session = ort.InferenceSession(str(self.model), sess_options=options)
            self._features = FeatureExtractor(
                feature_size=80, sampling_rate=self.sample_rate, chunk_length=self.seconds
            )
        return self._session

    def features(self, samples: npt.NDArray[np.int16]) -> npt.NDArray[np.float32]:
        """The model's input for ``samples``: (1, 80, 800) log-mel features of the last 8 s, normalized audio."""
        with self._lock:
            self._load()
            return self._input(samples)

    def _input(self, samples: npt.NDArray[np.int16]) -> npt.NDArray[np.float32]:
        size = self.seconds * self.sample_rate
        audio = np.asarray(samples, dtype=np.int16).reshape(-1)[-size:].astype(np.float32) / 32768.0
        audio = np.pad(audio, (size - audio.size, 0))  # silence in front, as the model was trained
        audio = (audio - audio.mean()) / np.sqrt(audio.var() + 1e-7)  # zero mean, unit variance
        mel = self._features(audio, padding=0)  # 801 centred frames; Whisper drops the last
        return np.asarray(mel[np.newaxis, :, : size // 160], dtype=np.float32)

    def probability(self, samples: npt.NDArray[np.int16]) -> float:
        if np.asarray(samples).size == 0:
            raise ValueError("SmartTurn needs the turn's audio; got no samples")
        with self._lock:
            session = self._load()
            (logits,) = session.run(None, {"input_features": self._input(samples)})
        return float(np.asarray(logits).reshape(-1)[0])  # the model's output is already a sigmoid

    def complete(self, samples: npt.NDArray[np.int16]) -> bool:
        return self.probability(samples) > self.threshold

    def __repr__(self) -> str:
        return f"SmartTurn(model={self.model.name!r}, threshold={self.threshold})"
