"""A real aiortc client for the tests: a WAV file as its microphone, the reply track measured.

Run as a program (``python -m tests.webrtc.client URL``) it connects, prints ``connected``
and talks until it is killed: the peer that vanishes without hanging up.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import sys
import time
import wave
from fractions import Fraction
from pathlib import Path
from typing import Any

import aiohttp
import av
import numpy as np
import numpy.typing as npt
from aiortc import MediaStreamTrack, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError
from aiortc.rtcsctptransport import DataChunk

from metronome_sdk._audio import level_dbfs, resample
from metronome_sdk.webrtc._peer import _hear_without_playout_delay

RATE = 48000
FRAME = 960  # 20 ms


class Microphone(MediaStreamTrack):
    """Plays ``speech`` once (or never), then silence, paced in real time like a microphone.

    With ``ends=True`` the track ends with the speech's last sample, as a file player's does.
    """

    kind = "audio"

    def __init__(self, speech: npt.NDArray[np.int16] | None = None, *, ends: bool = False) -> None:
        super().__init__()
        self._speech = speech if speech is not None else np.zeros(0, dtype=np.int16)
        self._pos = 0
        self._start: float | None = None
        self.ends = ends

    def say(self, speech: npt.NDArray[np.int16]) -> float:
        """Speak ``speech`` from now on (after what is still to be said); when it starts (time.monotonic())."""
        pad = np.zeros(max(0, self._pos - self._speech.size), dtype=np.int16)
        starts = self._speech.size + pad.size
        self._speech = np.concatenate([self._speech, pad, speech])
        origin = self._start if self._start is not None else time.monotonic()
        return origin + starts / RATE

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        if self.ends and self._pos >= self._speech.size:
            self.stop()
            raise MediaStreamError
        if self._start is None:
            self._start = time.monotonic()
        wait = self._start + self._pos / RATE - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        chunk = np.zeros(FRAME, dtype=np.int16)
        part = self._speech[self._pos : self._pos + FRAME]
        chunk[: part.size] = part
        frame = av.AudioFrame.from_ndarray(chunk.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate, frame.pts, frame.time_base = RATE, self._pos, Fraction(1, RATE)
        self._pos += FRAME
        return frame


def read_wav(path: Path) -> npt.NDArray[np.int16]:
    with wave.open(str(path)) as w:
        rate, data = w.getframerate(), w.readframes(w.getnframes())
    return resample(np.frombuffer(data, dtype=np.int16), rate, RATE)


async def offer_sdp() -> str:
    """A real offer (microphone and data channel), for requests that never connect."""
    pc = RTCPeerConnection()
    pc.createDataChannel("events")
    pc.addTrack(Microphone())
    await pc.setLocalDescription(await pc.createOffer())
    assert pc.localDescription is not None
    sdp = pc.localDescription.sdp
    await pc.close()
    return sdp


class Call:
    """One call to the server: events as they come, the reply audio's loudness."""

    def __init__(
        self, speech: npt.NDArray[np.int16] | None = None, *, track_ends: bool = False, playout_buffer: bool = True
    ) -> None:
        self.playout_buffer = playout_buffer  # False: hear each reply frame once whole, not 80 ms later
        self.pc = RTCPeerConnection()
        self.events: list[dict[str, Any]] = []
        self.arrivals: list[float] = []  # time.monotonic() of each event
        self.changed = asyncio.Event()
        self.loud_seconds = 0.0  # reply audio above -40 dBFS
        self.max_dbfs = -100.0
        self.channel = self.pc.createDataChannel("events")
        self.channel.on("message", self._on_message)
        self.levels: list[tuple[float, float]] = []  # (arrival, dBFS) of each reply frame
        self.microphone = Microphone(speech, ends=track_ends)
        self.pc.addTrack(self.microphone)
        self.pc.on("track", lambda track: asyncio.ensure_future(self._listen(track)))

    def _on_message(self, message: str | bytes) -> None:
        self.events.append(json.loads(message))
        self.arrivals.append(time.monotonic())
        self.changed.set()

    async def _listen(self, track: MediaStreamTrack) -> None:
        try:
            while True:
                frame = await track.recv()
                assert isinstance(frame, av.AudioFrame)
                pcm = frame.to_ndarray().reshape(-1).astype(np.int16)
                level = level_dbfs(pcm)
                self.levels.append((time.monotonic(), level))
                self.max_dbfs = max(self.max_dbfs, level)
                if level > -40.0:
                    self.loud_seconds += frame.samples / frame.sample_rate
                    self.changed.set()
        except MediaStreamError:
            return

    async def connect(self, url: str, *, token: str | None = None) -> None:
        await self.pc.setLocalDescription(await self.pc.createOffer())
        assert self.pc.localDescription is not None
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        offer = {"sdp": self.pc.localDescription.sdp, "type": "offer"}
        async with aiohttp.ClientSession() as http, http.post(url + "offer", json=offer, headers=headers) as resp:
            body = await resp.json()
            if resp.status != 200:
                raise RuntimeError(f"the server refused the call: {resp.status} {body}")
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=body["sdp"], type=body["type"]))
        if not self.playout_buffer:
            for transceiver in self.pc.getTransceivers():
                _hear_without_playout_delay(transceiver.receiver)

    def of_type(self, kind: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e.get("type") == kind]

    async def until(self, done: Any, timeout: float) -> None:
        """Wait until ``done()`` holds; fail with what was seen after ``timeout`` seconds."""
        async with asyncio.timeout(timeout):
            while not done():
                self.changed.clear()
                await self.changed.wait()

    def stats_gaps(self, since: float) -> list[float]:
        """Seconds between the ``stats`` events that came after ``since`` (the server sends two a second)."""
        times = [t for e, t in zip(self.events, self.arrivals, strict=True) if e.get("type") == "stats" and t >= since]
        return [b - a for a, b in itertools.pairwise(times)]

    def go_dark(self) -> None:
        """Vanish from the network without a word (no BYE, no DTLS close): close the ICE sockets."""
        dtls = self.pc.sctp.transport if self.pc.sctp is not None else None
        assert dtls is not None, "not connected"
        for protocol in dtls.transport._connection._protocols:
            if protocol.transport is not None:
                protocol.transport.close()

    def stop_reading(self) -> None:
        """Stay connected and keep talking, but never read (nor acknowledge) what comes on the data channel."""
        sctp = self.pc.sctp
        assert sctp is not None, "not connected"
        receive_chunk = sctp._receive_chunk

        async def deaf(chunk: Any) -> None:
            if not isinstance(chunk, DataChunk):
                await receive_chunk(chunk)

        sctp._receive_chunk = deaf  # type: ignore[method-assign]

    async def close(self) -> None:
        await self.pc.close()


def tone(seconds: float, hz: float = 300.0) -> npt.NDArray[np.int16]:
    t = np.arange(round(seconds * RATE)) / RATE
    return (10000 * np.sin(2 * np.pi * hz * t)).astype(np.int16)


def answered(call: Call) -> bool:
    return any(e["role"] == "assistant" and e["final"] for e in call.of_type("transcript"))


async def _talk_until_killed(url: str) -> None:
    call = Call(speech=tone(0.6))
    await call.connect(url)
    await call.until(lambda: answered(call), 30)
    print("answered", flush=True)
    await asyncio.sleep(3600)


if __name__ == "__main__":
    asyncio.run(_talk_until_killed(sys.argv[1]))
