"""Sessions over WebRTC (aiortc): a peer's microphone in, the session's answer out, events beside.

``WebRTCServer`` is the signaling server and the demo page; ``WebRTCPeer`` is one peer
connection as a ``Transport``; ``ReplyAudioTrack`` is the paced outbound audio track.
"""

from ._demo import demo_engine
from ._peer import WebRTCPeer
from ._server import DEFAULT_PROMPT, PeerHandler, ServerConfig, WebRTCServer
from ._tracks import ReplyAudioTrack

__all__ = [
    "DEFAULT_PROMPT",
    "PeerHandler",
    "ReplyAudioTrack",
    "ServerConfig",
    "WebRTCPeer",
    "WebRTCServer",
    "demo_engine",
]
