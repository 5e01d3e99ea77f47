"""Speech to text with pocketsphinx: offline, English, its model ships inside the wheel."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import numpy.typing as npt

from .._audio import resample
from .._extras import require

__all__ = ["PocketSphinxSTT"]


class PocketSphinxSTT:
    """``SpeechToText`` with pocketsphinx's bundled en-us model, decoding at 16 kHz.

    Accuracy is that of a small offline model (fine for a demo, not for a product);
    plug in a better recognizer through the ``SpeechToText`` protocol. ``options`` go to
    ``pocketsphinx.Decoder`` unchanged. The decoder loads on first use.
    """

    sample_rate = 16000

    def __init__(self, **options: Any) -> None:
        self._options = {"samprate": self.sample_rate, "loglevel": "FATAL", **options}
        self._decoder: Any = None
        self._lock = threading.Lock()  # one decoder, one utterance at a time

    def load(self) -> None:
        """Load the decoder now (about a second) instead of on the first utterance."""
        with self._lock:
            self._load()

    def _load(self) -> Any:
        if self._decoder is None:
            pocketsphinx = require("pocketsphinx", extra="voice", feature="PocketSphinxSTT")
            self._decoder = pocketsphinx.Decoder(**self._options)
        return self._decoder

    def transcribe(self, samples: npt.NDArray[np.int16], sample_rate: int) -> str:
        pcm = resample(np.asarray(samples, dtype=np.int16).reshape(-1), sample_rate, self.sample_rate)
        with self._lock:
            decoder = self._load()
            decoder.start_utt()
            decoder.process_raw(pcm.tobytes(), False, True)
            decoder.end_utt()
            hyp = decoder.hyp()
        return str(hyp.hypstr).strip() if hyp is not None else ""

    def __repr__(self) -> str:
        return f"PocketSphinxSTT(sample_rate={self.sample_rate})"
