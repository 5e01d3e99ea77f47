"""A transport in memory: for tests, and for embedding a session into a voice-agent pipeline."""

from __future__ import annotations

import math
from collections.abc import AsyncIterator

import anyio
import numpy as np
import numpy.typing as npt

from .._audio import Framer, pcm16, resample
from .._frames import InputFrame
from ._base import Event

__all__ = ["MemoryTransport"]


class MemoryTransport:
    """Both ends of one peer in memory.

    The pipeline's end is the ``Transport`` protocol (``receive_audio``, ``send_audio``,
    ``send_event``, ``aclose``). The application's end feeds the microphone with
    ``push_audio`` (any rate; cut into ``frame_seconds`` frames at ``sample_rate``), hangs
    up with ``hang_up``, and reads what the pipeline said with ``audio()`` and ``events()``
    (or ``next_event``). Nothing is paced: audio moves as fast as both ends go. Use it
    with ``async with`` (or call ``close()``) so that both ends are closed at the end.
    """

    def __init__(self, *, sample_rate: int = 16000, frame_seconds: float = 0.08, buffer: int = 4096) -> None:
        if not 0.005 <= frame_seconds <= 1.0:
            raise ValueError(f"frame_seconds must be in [0.005, 1] s, got {frame_seconds!r}; try 0.08")
        self.sample_rate = sample_rate
        self._framer = Framer(round(sample_rate * frame_seconds))
        self._mic_in, self._mic_out = anyio.create_memory_object_stream[InputFrame](buffer)
        self._speech_in, self._speech_out = anyio.create_memory_object_stream[npt.NDArray[np.int16]](math.inf)
        self._events_in, self._events_out = anyio.create_memory_object_stream[Event](math.inf)
        self.closed = False

    async def __aenter__(self) -> MemoryTransport:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close both ends; what was not read is dropped."""
        self.closed = True
        for stream in (
            self._mic_in,
            self._mic_out,
            self._speech_in,
            self._speech_out,
            self._events_in,
            self._events_out,
        ):
            stream.close()

    # the pipeline's end --------------------------------------------------------------------------

    async def receive_audio(self) -> InputFrame:
        return await self._mic_out.receive()  # EndOfStream once the application hung up

    async def send_audio(self, samples: npt.NDArray[np.int16], sample_rate: int) -> None:
        if not self.closed:
            await self._speech_in.send(resample(samples, sample_rate, self.sample_rate))

    async def send_event(self, event: Event) -> None:
        if not self.closed:
            await self._events_in.send(event)

    async def aclose(self) -> None:
        if self.closed:
            return
        self.closed = True
        self._mic_out.close()  # the microphone goes deaf: the application's pushes are dropped
        self._speech_in.close()
        self._events_in.close()

    # the application's end -----------------------------------------------------------------------

    async def push_audio(self, samples: npt.NDArray[np.int16] | npt.NDArray[np.float32], sample_rate: int) -> None:
        """Speak into the microphone (int16, or float32 in [-1, 1])."""
        pcm = resample(pcm16(samples), sample_rate, self.sample_rate)
        for frame in self._framer.push(pcm):
            try:
                await self._mic_in.send(InputFrame.from_audio(frame, sample_rate=self.sample_rate))
            except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                return  # the pipeline hung up

    async def push_silence(self, seconds: float) -> None:
        await self.push_audio(np.zeros(round(seconds * self.sample_rate), dtype=np.int16), self.sample_rate)

    def hang_up(self) -> None:
        """The peer leaves: the pipeline's ``receive_audio`` raises ``anyio.EndOfStream``."""
        self._mic_in.close()

    async def next_event(self) -> Event:
        """The next event the pipeline sent; ``anyio.EndOfStream`` after it hung up and all were read."""
        return await self._events_out.receive()

    async def events(self) -> AsyncIterator[Event]:
        async for event in self._events_out:
            yield event

    async def audio(self) -> AsyncIterator[npt.NDArray[np.int16]]:
        """The speech the pipeline sent, at ``sample_rate``, chunk by chunk."""
        async for chunk in self._speech_out:
            yield chunk

    def __repr__(self) -> str:
        state = "closed" if self.closed else "open"
        return f"MemoryTransport(sample_rate={self.sample_rate}, frame={self._framer.size} samples, {state})"
