"""``metronome serve``: an OpenAI-compatible chat-completions server on the embedded engine.

``ChatServer(engine, ServeConfig(...))``; ``async with`` starts and stops it. See docs/serve.md.
"""

from ._config import ServeConfig
from ._openai import SESSION_FIELD, SESSION_HEADER
from ._server import ChatServer

__all__ = ["SESSION_FIELD", "SESSION_HEADER", "ChatServer", "ServeConfig"]
