"""The outbound audio track: queued speech, paced in real time."""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections import deque
from fractions import Fraction

import av
import numpy as np
import numpy.typing as npt
from aiortc import MediaStreamTrack
from aiortc.mediastreams import MediaStreamError

from .._audio import resample

__all__ = ["LEAD_PAYBACK", "ReplyAudioTrack", "check_lead"]

LEAD_PAYBACK = 0.05  # of each quiet frame's time: how fast the lead is given back (80 ms in 1.6 s)


def check_lead(lead: float, name: str = "lead") -> float:
    """``lead`` as seconds a reply may run ahead of the wall clock, or ``ValueError``."""
    if isinstance(lead, bool) or not isinstance(lead, int | float) or not (math.isfinite(lead) and 0 <= lead <= 1):
        raise ValueError(f"{name} must be seconds in [0, 1], got {lead!r}; try 0.08")
    return float(lead)


class ReplyAudioTrack(MediaStreamTrack):
    """The outbound audio track: queued speech, paced against the wall clock.

    Each ``recv()`` returns ``frame_seconds`` of mono int16 audio at ``sample_rate``; its
    ``pts`` advances by the samples sent, in a time base of ``1/sample_rate``. Between
    replies the track carries silence (the peer is listening, and RTP must keep flowing);
    when the session fails the track is stopped, so ``recv()`` ends with
    ``MediaStreamError`` instead of going on with silence as if all were well.

    The queue holds at most ``max_queued_seconds`` of speech: a voice that speaks faster
    than the track plays drops its oldest queued speech (counted in ``samples_dropped``),
    so memory stays bounded and the peer hears the latest words, not words from long ago.

    ``lead``: while speech is queued, the track runs that many seconds ahead of the wall clock,
    so the first frames of a reply go out at once, back to back. A receiver that holds a few
    packets back before it hands the first one on (aiortc's audio receiver waits for four,
    80 ms) then hands the reply's first frame on as soon as it arrives, instead of after the
    next four frames' real time. While quiet, the track gives the lead back a little each frame
    (``LEAD_PAYBACK`` of a frame, 1 ms of 20: a gentle drift a jitter buffer follows, not a gap),
    so the next reply has it again. The cost: a barge-in cuts the speech not yet sent, and the
    peer still plays up to ``lead`` seconds already sent. ``lead=0``: paced on the wall clock.
    """

    kind = "audio"

    def __init__(
        self,
        *,
        sample_rate: int = 48000,
        frame_seconds: float = 0.02,
        max_queued_seconds: float = 30.0,
        lead: float = 0.0,
    ) -> None:
        if not 0 < max_queued_seconds < float("inf"):
            raise ValueError(f"max_queued_seconds must be a finite number > 0, got {max_queued_seconds!r}; try 30")
        self.lead = check_lead(lead)
        super().__init__()
        self.sample_rate = sample_rate
        self.samples_per_frame = round(sample_rate * frame_seconds)
        self._time_base = Fraction(1, sample_rate)
        self._queue: deque[npt.NDArray[np.int16]] = deque()
        self._queued = 0
        self.max_queued = round(max_queued_seconds * sample_rate)
        self.samples_dropped = 0
        self._start: float | None = None
        self._pts = 0
        self.samples_sent = 0  # of queued speech, not of silence
        self._ahead = 0.0  # seconds the track now runs ahead of the wall clock, up to lead
        self._speech = asyncio.Event()  # speech was queued: a frame waiting on the clock may go at once

    @property
    def queued_seconds(self) -> float:
        return self._queued / self.sample_rate

    @property
    def ahead(self) -> float:
        """Seconds the track runs ahead of the wall clock now: ``lead`` with speech queued, less as it is given back."""
        return self._ahead

    def enqueue(self, samples: npt.NDArray[np.int16], sample_rate: int) -> None:
        """Queue speech behind what is queued (resampled to the track's rate)."""
        pcm = resample(np.asarray(samples, dtype=np.int16).reshape(-1), sample_rate, self.sample_rate)
        if pcm.size:
            self._queue.append(pcm)
            self._queued += pcm.size
            self._speech.set()
        while self._queued > self.max_queued:  # drop the oldest speech, never grow without bound
            excess = self._queued - self.max_queued
            head = self._queue[0]
            if head.size <= excess:
                self._queue.popleft()
                cut = head.size
            else:
                self._queue[0] = head[excess:]
                cut = excess
            self._queued -= cut
            self.samples_dropped += cut

    def clear(self) -> None:
        """Drop queued speech (a barge-in)."""
        self._queue.clear()
        self._queued = 0

    def _take(self, n: int) -> npt.NDArray[np.int16]:
        out = np.zeros(n, dtype=np.int16)
        filled = 0
        while filled < n and self._queue:
            head = self._queue[0]
            k = min(n - filled, head.size)
            out[filled : filled + k] = head[:k]
            filled += k
            if k == head.size:
                self._queue.popleft()
            else:
                self._queue[0] = head[k:]
        self._queued -= filled
        self.samples_sent += filled
        return out

    async def _until_due(self) -> None:
        """Wait until the next frame is due: its time on the wall clock, less the lead while speech is queued."""
        assert self._start is not None
        while True:
            ahead = self.lead if self._queued else self._ahead
            wait = self._start + self._pts / self.sample_rate - ahead - time.monotonic()
            if wait <= 0:
                return
            self._speech.clear()
            if self._queued or not self.lead:  # nothing can make it due sooner
                await asyncio.sleep(wait)
                return
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._speech.wait(), wait)

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        if self._start is None:
            self._start = time.monotonic()
        else:
            self._pts += self.samples_per_frame
            await self._until_due()
            if self.readyState != "live":  # stopped while it waited
                raise MediaStreamError
        if self._queued:
            self._ahead = self.lead
        else:  # quiet: give the lead back slowly, so the next reply has it again
            self._ahead = max(0.0, self._ahead - LEAD_PAYBACK * self.samples_per_frame / self.sample_rate)
        frame = av.AudioFrame.from_ndarray(
            self._take(self.samples_per_frame).reshape(1, -1), format="s16", layout="mono"
        )
        frame.sample_rate = self.sample_rate
        frame.pts = self._pts
        frame.time_base = self._time_base
        return frame
