"""Transports: how a voice pipeline reaches its peer (WebRTC lives in ``metronome_sdk.webrtc``)."""

from ._base import Event, Transport
from ._memory import MemoryTransport

__all__ = ["Event", "MemoryTransport", "Transport"]
