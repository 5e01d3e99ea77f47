"""One peer over an aiortc ``RTCPeerConnection``, as a ``Transport`` for a voice pipeline."""

from __future__ import annotations

import asyncio
import json
from collections import deque
from typing import Any

import anyio
import av
import numpy as np
import numpy.typing as npt
from aiortc import MediaStreamTrack, RTCDataChannel, RTCPeerConnection, RTCSessionDescription
from aiortc.jitterbuffer import JitterBuffer
from aiortc.mediastreams import MediaStreamError

from .._audio import Framer, StreamResampler
from .._exceptions import SessionBroken
from .._frames import InputFrame
from .._log import get_logger
from ..transports._base import Event
from ._tracks import ReplyAudioTrack

__all__ = ["WebRTCPeer"]

_PENDING_EVENTS = 256  # events kept while the data channel is not open yet
_CONNECT_GRACE = 5.0  # seconds a closing peer waits for its data channel, to deliver early events
_INBOX = 64  # microphone frames buffered for a slow pipeline; the oldest go first


def _hear_without_playout_delay(receiver: Any) -> None:
    """Hand each microphone frame on as soon as it is whole, not four frames (80 ms) later.

    aiortc's audio receiver holds four frames back before the first one, a playout buffer
    against network jitter. Nothing here plays the microphone: it is heard by a turn
    detector and a recognizer, so those 80 ms are pure delay, added to every turn's end and
    every barge-in. A frame late or out of order is dropped instead (a 20 ms gap in speech
    that only a recognizer hears). The buffer is a private attribute: where it is missing (another
    aiortc), the receiver keeps its own.
    """
    name = "_RTCRtpReceiver__jitter_buffer"
    if isinstance(getattr(receiver, name, None), JitterBuffer):
        setattr(receiver, name, JitterBuffer(capacity=16, prefetch=1))


class WebRTCPeer:
    """A browser or phone on a peer connection: its microphone in, speech and events out.

    The inbound audio track is decoded by aiortc and resampled with PyAV to mono int16 at
    ``sample_rate``, in frames of ``frame_seconds`` (audio ``InputFrame``s, the engine's
    frame format). Speech goes out on a ``ReplyAudioTrack`` (``reply_lead``: its ``lead``); events
    go out as JSON text on the data channel the peer opened. A peer that sends no audio for ``media_timeout``
    seconds has vanished: ``receive_audio`` raises ``SessionBroken``. ``aclose`` lets
    queued events reach the peer (up to ``close_grace`` seconds), then closes the connection.

    How the call ends is in ``ended_by``; ``receive_audio`` says it to the pipeline:

    - ``anyio.EndOfStream`` when the peer hung up: ``"bye"``, ``"channel_closed"`` (its
      data channel closed mid-call: events can no longer reach it), ``"connection_closed"``,
      ``"track_ended"``, or ``"closed_locally"`` (``aclose``);
    - ``SessionBroken`` when something outside died, with ``reason``: ``"ice_failed"``
      (the connection went to ``failed``: ICE or DTLS), ``"peer_vanished"`` (no audio for
      ``media_timeout``), ``"slow_consumer"`` (more than ``max_buffered`` bytes of events
      wait for the peer to read them: the peer is shed, since a peer that stopped reading
      would otherwise make the server buffer without bound).
    """

    def __init__(
        self,
        *,
        sample_rate: int = 16000,
        frame_seconds: float = 0.08,
        media_timeout: float = 10.0,
        close_grace: float = 0.5,
        max_buffered: int = 256 << 10,
        session_id: int | None = None,
        reply_lead: float = 0.0,
    ) -> None:
        if not media_timeout > 0:
            raise ValueError(f"media_timeout must be > 0 seconds, got {media_timeout!r}; try 10")
        if isinstance(max_buffered, bool) or not isinstance(max_buffered, int) or max_buffered < 1:
            raise ValueError(f"max_buffered must be an int >= 1 (bytes), got {max_buffered!r}; try 262144")
        self.sample_rate = sample_rate
        self.frame_samples = round(sample_rate * frame_seconds)
        self.media_timeout = media_timeout
        self.close_grace = close_grace
        self.max_buffered = max_buffered
        self.session_id = session_id
        self.ended_by: str | None = None
        self.pc = RTCPeerConnection()
        self.reply = ReplyAudioTrack(lead=reply_lead)
        self.channel: RTCDataChannel | None = None
        self.closed = False
        self._log = get_logger(session_id=session_id) if session_id is not None else get_logger()
        self._pending: deque[str] = deque(maxlen=_PENDING_EVENTS)
        self._inbox: asyncio.Queue[InputFrame | BaseException] = asyncio.Queue(maxsize=_INBOX)
        self._ended = False
        self._channel_open = asyncio.Event()
        self._microphone: MediaStreamTrack | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._hang_up: asyncio.Future[None] | None = None
        self.pc.on("track", self._on_track)
        self.pc.on("datachannel", self._on_datachannel)
        self.pc.on("connectionstatechange", self._on_state)

    async def accept(self, sdp: str, kind: str = "offer") -> RTCSessionDescription:
        """Take the peer's offer and return the answer (ICE candidates included).

        Raises ``ValueError`` for an offer that cannot be served (unparseable, or without
        an audio track to listen to); the caller closes the peer.
        """
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=sdp, type=kind))
        for transceiver in self.pc.getTransceivers():
            if transceiver.kind == "audio":
                _hear_without_playout_delay(transceiver.receiver)
        if self._microphone is None:
            raise ValueError("the offer carries no audio track to listen to; offer a microphone (sendrecv audio)")
        self.pc.addTrack(self.reply)
        await self.pc.setLocalDescription(await self.pc.createAnswer())
        for dtls in {id(t.receiver.transport): t.receiver.transport for t in self.pc.getTransceivers()}.values():
            dtls.on("statechange", lambda dtls=dtls: self._on_dtls_state(dtls))
        answer = self.pc.localDescription
        assert answer is not None
        return answer

    # aiortc's events -----------------------------------------------------------------------------

    def _spawn(self, coro: Any) -> None:
        task: asyncio.Task[None] = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _on_track(self, track: MediaStreamTrack) -> None:
        if track.kind == "audio" and self._microphone is None:
            self._microphone = track
            self._spawn(self._read(track))
        else:
            self._spawn(self._drain(track))  # an unread track would buffer without bound

    def _on_datachannel(self, channel: RTCDataChannel) -> None:
        if self.channel is not None:
            return
        self.channel = channel
        channel.on("open", self._flush)
        channel.on("message", self._on_message)
        channel.on("close", lambda: self._end(anyio.EndOfStream(), "channel_closed"))
        if channel.readyState == "open":
            self._flush()

    def _on_message(self, message: str | bytes) -> None:
        try:
            event = json.loads(message)
        except (ValueError, UnicodeDecodeError):
            return
        if isinstance(event, dict) and event.get("type") == "bye":
            self._end(anyio.EndOfStream(), "bye")

    def _on_state(self) -> None:
        state = self.pc.connectionState
        self._log.info("webrtc.connection", state=state)
        if state == "failed":
            self._end(self._broken("the peer connection failed (ICE or DTLS)", "ice_failed"), "ice_failed")
        elif state == "closed":
            self._end(anyio.EndOfStream(), "connection_closed")

    def _on_dtls_state(self, dtls: Any) -> None:
        # aiortc reports an ICE connection that died (consent expired, RFC 7675) as DTLS "closed", then
        # closes the peer connection: "closed", like a hang-up. Tell them apart while the ICE side still shows it.
        if dtls.state == "closed" and not self.closed and getattr(dtls.transport._connection, "_closing", False):
            self._end(self._broken("the peer connection failed: ICE consent expired", "ice_failed"), "ice_failed")

    # microphone ----------------------------------------------------------------------------------

    def _put(self, item: InputFrame | BaseException) -> None:
        if self._ended:
            return
        if self._inbox.full():
            self._inbox.get_nowait()  # a pipeline this far behind loses the oldest audio, not the newest
        self._inbox.put_nowait(item)

    def _broken(self, message: str, reason: str) -> SessionBroken:
        return SessionBroken(message, session_id=self.session_id, reason=reason)

    def _end(self, why: BaseException, reason: str) -> None:
        if not self._ended:
            self._put(why)
            self._ended = True
            self.ended_by = reason
            self._log.info("webrtc.peer_ended", reason=reason)

    async def _read(self, track: MediaStreamTrack) -> None:
        resampler = StreamResampler(self.sample_rate)
        framer = Framer(self.frame_samples)
        while not self._ended:
            try:
                frame = await asyncio.wait_for(track.recv(), self.media_timeout)
            except TimeoutError:
                self._log.warning("webrtc.peer_vanished", silent_for=self.media_timeout)
                message = f"no audio from the peer for {self.media_timeout:g} s: it vanished"
                self._end(self._broken(message, "peer_vanished"), "peer_vanished")
                return
            except MediaStreamError:
                self._end(anyio.EndOfStream(), "track_ended")
                return
            if not isinstance(frame, av.AudioFrame):
                continue
            for chunk in framer.push(resampler.push(frame)):
                self._put(InputFrame.from_audio(chunk, sample_rate=self.sample_rate))

    @staticmethod
    async def _drain(track: MediaStreamTrack) -> None:
        try:
            while True:
                await track.recv()
        except MediaStreamError:
            return

    # the Transport protocol ----------------------------------------------------------------------

    async def receive_audio(self) -> InputFrame:
        item = await self._inbox.get()
        if isinstance(item, BaseException):
            self._inbox.put_nowait(item)  # every later call ends the same way
            raise item
        return item

    async def send_audio(self, samples: npt.NDArray[np.int16], sample_rate: int) -> None:
        if not self.closed:
            self.reply.enqueue(samples, sample_rate)

    @property
    def queued_audio_seconds(self) -> float:
        """Seconds of speech queued on the reply track, not yet played."""
        return self.reply.queued_seconds

    def clear_audio(self) -> None:
        """Cut the speech not yet played (barge-in): the peer hears it stop within a frame (20 ms)."""
        self.reply.clear()

    @property
    def gone(self) -> bool:
        """The peer left (or was shed): nothing sent now reaches it. Not when only its track ended."""
        return self.ended_by is not None and self.ended_by != "track_ended"

    async def send_event(self, event: Event) -> None:
        if self.closed or self.ended_by == "slow_consumer":
            return
        text = json.dumps(event, default=str)
        channel = self.channel
        if channel is not None and channel.readyState == "open":
            if channel.bufferedAmount > self.max_buffered:
                # the peer stopped reading (aiortc would queue without bound): shed it, as the engine sheds
                self._log.warning("webrtc.slow_consumer", buffered=channel.bufferedAmount, limit=self.max_buffered)
                unread = f"the peer left {channel.bufferedAmount} bytes of events unread (limit {self.max_buffered})"
                self._end(self._broken(unread, "slow_consumer"), "slow_consumer")
                return
            self._flush()
            channel.send(text)
        else:
            self._pending.append(text)

    def _flush(self) -> None:
        channel = self.channel
        if channel is None or channel.readyState != "open":
            return
        self._channel_open.set()
        while self._pending:
            channel.send(self._pending.popleft())

    async def aclose(self) -> None:
        """Hang up: stop the reply track, let queued events out, close the connection.

        Every call waits for the same hang-up; a caller that is cancelled does not cut it short.
        """
        if self._hang_up is None:
            self.closed = True
            self._end(anyio.EndOfStream(), "closed_locally")  # unless the peer ended the call first
            self.reply.stop()
            self._hang_up = asyncio.ensure_future(self._close())
        # shielded: a cancelled caller must not cancel aiortc's close half-way (its close() then breaks)
        await asyncio.shield(self._hang_up)

    async def _close(self) -> None:
        if self._pending and self.pc.connectionState in ("new", "connecting", "connected"):
            # events sent before the peer's data channel opened (an early failure): wait for it a little
            with anyio.move_on_after(_CONNECT_GRACE):
                await self._channel_open.wait()
            self._flush()
        channel = self.channel
        if channel is not None and channel.readyState == "open" and self.close_grace > 0:
            with anyio.move_on_after(self.close_grace):
                while channel.bufferedAmount > 0:
                    await asyncio.sleep(0.01)
                await asyncio.sleep(min(0.1, self.close_grace))  # the last packets' flight
        try:
            await self.pc.close()
        finally:  # even when aiortc fails to close a half-built connection, our tasks end
            for task in list(self._tasks):
                task.cancel()
            await asyncio.gather(*self._tasks, return_exceptions=True)

    def __repr__(self) -> str:
        return f"WebRTCPeer(state={self.pc.connectionState!r}, closed={self.closed})"
