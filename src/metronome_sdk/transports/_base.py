"""What a voice pipeline sees of its peer: microphone frames in, speech and events out."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from .._frames import InputFrame

__all__ = ["Event", "Transport"]

Event = dict[str, Any]  # one JSON object: {"type": ..., ...}; docs/webrtc.md lists the types


@runtime_checkable
class Transport(Protocol):
    """One peer. ``WebRTCPeer`` carries it over a peer connection, ``MemoryTransport`` in memory.

    ``receive_audio`` returns the next frame of microphone audio as an audio ``InputFrame``
    (mono int16; the frame length is the transport's); it raises ``anyio.EndOfStream``
    when the peer hung up and ``SessionBroken`` when it vanished. ``send_audio`` queues
    speech behind what is already queued; ``send_event`` sends one JSON event;
    ``aclose`` hangs up (idempotent).
    """

    async def receive_audio(self) -> InputFrame: ...

    async def send_audio(self, samples: npt.NDArray[np.int16], sample_rate: int) -> None: ...

    async def send_event(self, event: Event) -> None: ...

    async def aclose(self) -> None: ...
