"""``metronome serve``: an OpenAI-compatible chat-completions server on the embedded engine.

``ChatServer(engine, ServeConfig(...))``; ``async with`` starts and stops it. See docs/serve.md.
"""

from ._config import RealtimeConfig, ServeConfig
from ._server import ChatServer

__all__ = ["ChatServer", "RealtimeConfig", "ServeConfig"]
