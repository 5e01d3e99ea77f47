"""Turn-taking by voice activity: an utterance starts with speech and ends with a pause."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from ._audio import level_dbfs

__all__ = ["VoiceActivityDetector"]

_WINDOW_SECONDS = 0.02


class VoiceActivityDetector:
    """Energy-based end-of-turn detection over 20 ms windows.

    A window louder than ``threshold_db`` (dBFS) is speech. An utterance starts after
    ``min_speech`` seconds of speech and ends after ``end_silence`` seconds of quiet
    (or at ``max_utterance`` seconds); ``pre_roll`` seconds before its start are kept so
    the first syllable is not clipped. ``push`` returns each finished utterance once.
    """

    def __init__(
        self,
        *,
        sample_rate: int = 16000,
        threshold_db: float = -45.0,
        min_speech: float = 0.2,
        end_silence: float = 0.7,
        max_utterance: float = 15.0,
        pre_roll: float = 0.2,
    ) -> None:
        if not -100.0 < threshold_db < 0.0:
            raise ValueError(f"threshold_db must be in (-100, 0) dBFS, got {threshold_db!r}; try -45")
        for name, value in (("min_speech", min_speech), ("end_silence", end_silence), ("pre_roll", pre_roll)):
            if not 0.0 <= value <= 10.0:
                raise ValueError(f"{name} must be in [0, 10] seconds, got {value!r}")
        if not max_utterance > end_silence:
            raise ValueError(f"max_utterance ({max_utterance!r} s) must exceed end_silence ({end_silence!r} s)")
        self.sample_rate = sample_rate
        self.threshold_db = threshold_db
        self._window = max(1, int(sample_rate * _WINDOW_SECONDS))
        self._min_speech = round(min_speech / _WINDOW_SECONDS)
        self._end_silence = round(end_silence / _WINDOW_SECONDS)
        self._max_windows = round(max_utterance / _WINDOW_SECONDS)
        self._pre_roll = round(pre_roll / _WINDOW_SECONDS)
        self._pending = np.zeros(0, dtype=np.int16)
        self._windows: list[npt.NDArray[np.int16]] = []  # pre-roll while quiet, the utterance while speaking
        self._voiced = 0  # consecutive loud windows (before the start) or loud windows in all (after)
        self._quiet = 0
        self.speaking = False

    def push(self, samples: npt.NDArray[np.int16]) -> list[npt.NDArray[np.int16]]:
        """Feed audio; get the utterances that ended within it (usually none)."""
        data = np.concatenate([self._pending, samples.reshape(-1)])
        whole = data.size // self._window * self._window
        self._pending = data[whole:].copy()
        done = []
        for i in range(0, whole, self._window):
            utterance = self._step(data[i : i + self._window])
            if utterance is not None:
                done.append(utterance)
        return done

    def _step(self, window: npt.NDArray[np.int16]) -> npt.NDArray[np.int16] | None:
        loud = level_dbfs(window) > self.threshold_db
        self._windows.append(window)
        if not self.speaking:
            self._voiced = self._voiced + 1 if loud else 0
            if self._voiced >= max(1, self._min_speech):
                self.speaking, self._quiet = True, 0
            else:
                del self._windows[: -(self._pre_roll + self._voiced) or len(self._windows)]
            return None
        self._quiet = 0 if loud else self._quiet + 1
        if self._quiet >= self._end_silence or len(self._windows) >= self._max_windows:
            utterance = np.concatenate(self._windows[: len(self._windows) - self._quiet] or self._windows)
            self._windows, self._voiced, self._quiet, self.speaking = [], 0, 0, False
            return utterance
        return None

    def reset(self) -> None:
        self._pending = np.zeros(0, dtype=np.int16)
        self._windows, self._voiced, self._quiet, self.speaking = [], 0, 0, False
