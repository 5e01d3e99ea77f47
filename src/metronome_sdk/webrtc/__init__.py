"""Sessions over WebRTC (aiortc): a peer's microphone in, the session's answer out, events beside.

``WebRTCServer`` is the signaling server and the demo page; ``WebRTCPeer`` is one peer
connection as a ``Transport``; ``ReplyAudioTrack`` is the paced outbound audio track.
Needs the ``[webrtc]`` extra (aiortc, PyAV); the default voice agent, the ``[voice]`` extra.
"""

from .._extras import require as _require

_require("aiortc", extra="webrtc", feature="metronome_sdk.webrtc (the WebRTC transport, metronome demo)")

# after the check, so that a missing extra says so first
from ._config import DEFAULT_PROMPT, ServerConfig  # noqa: E402
from ._demo import demo_engine, voice_threads  # noqa: E402
from ._peer import WebRTCPeer  # noqa: E402
from ._server import PeerHandler, WebRTCServer  # noqa: E402
from ._tracks import ReplyAudioTrack  # noqa: E402

__all__ = [
    "DEFAULT_PROMPT",
    "PeerHandler",
    "ReplyAudioTrack",
    "ServerConfig",
    "WebRTCPeer",
    "WebRTCServer",
    "demo_engine",
    "voice_threads",
]
