"""PCM helpers shared by the transports and the voice pipeline: int16 mono, resampled with PyAV.

A neutral module, so that neither ``transports`` nor ``voice`` imports the other for them.
PyAV (the ``[webrtc]`` or ``[voice]`` extra) loads only when something is resampled.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from ._extras import require

if TYPE_CHECKING:
    import av

__all__: list[str] = []  # internal: Framer, StreamResampler, level_dbfs, pcm16, resample, without_lead

PCM16 = npt.NDArray[np.int16]


def pcm16(samples: npt.NDArray[Any]) -> PCM16:
    """Mono int16 PCM from int16 or float32 in ``[-1, 1]``."""
    if samples.dtype == np.int16:
        return samples.reshape(-1)
    clipped = np.clip(np.asarray(samples, dtype=np.float32).reshape(-1), -1.0, 1.0)
    return (clipped * 32767.0).astype(np.int16)


def level_dbfs(samples: PCM16) -> float:
    """Loudness as RMS in dB below full scale (-100 for digital silence)."""
    if samples.size == 0:
        return -100.0
    rms = float(np.sqrt(np.mean(np.square(samples, dtype=np.float64)))) / 32768.0
    return max(-100.0, 20.0 * float(np.log10(max(rms, 1e-5))))


def without_lead(samples: PCM16, sample_rate: int, *, level: int = 300, keep: float = 0.01) -> PCM16:
    """``samples`` from ``keep`` seconds before the first one above ``level`` (all of them if none is).

    A voice starts each sentence after some quiet (Piper's: 40-60 ms); before a reply's first
    words that quiet is only latency the caller waits through.
    """
    loud = np.flatnonzero(np.abs(samples.astype(np.int32)) > level)
    if loud.size == 0:
        return samples
    return samples[max(0, int(loud[0]) - round(keep * sample_rate)) :]


def _av() -> Any:
    return require("av", extra="webrtc", feature="resampling audio (PyAV)")


def _frame(samples: PCM16, sample_rate: int) -> av.AudioFrame:
    frame: av.AudioFrame = _av().AudioFrame.from_ndarray(samples.reshape(1, -1), format="s16", layout="mono")
    frame.sample_rate = sample_rate
    return frame


def _join(frames: list[av.AudioFrame]) -> PCM16:
    if not frames:
        return np.zeros(0, dtype=np.int16)
    return np.concatenate([f.to_ndarray().reshape(-1) for f in frames]).astype(np.int16, copy=False)


def resample(samples: PCM16, from_rate: int, to_rate: int) -> PCM16:
    """All of ``samples`` at ``to_rate`` (one shot: the resampler is flushed)."""
    if from_rate == to_rate or samples.size == 0:
        return samples
    resampler = _av().AudioResampler(format="s16", layout="mono", rate=to_rate)
    return _join([*resampler.resample(_frame(samples, from_rate)), *resampler.resample(None)])


class StreamResampler:
    """Decoded frames of a live stream (any format, layout and rate) to mono int16 at ``rate``."""

    def __init__(self, rate: int) -> None:
        self.rate = rate
        self._resampler = _av().AudioResampler(format="s16", layout="mono", rate=rate)

    def push(self, frame: av.AudioFrame) -> PCM16:
        return _join(self._resampler.resample(frame))


class Framer:
    """Cuts a stream of samples into frames of exactly ``size`` samples."""

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"a frame holds at least one sample, got size={size}")
        self.size = size
        self._pending = np.zeros(0, dtype=np.int16)

    def push(self, samples: PCM16) -> list[PCM16]:
        data = np.concatenate([self._pending, samples]) if self._pending.size else samples
        whole = data.size // self.size * self.size
        self._pending = data[whole:].copy()
        return [data[i : i + self.size] for i in range(0, whole, self.size)]
