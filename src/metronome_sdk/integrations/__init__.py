"""Adapters for voice-agent frameworks, and what they share.

- ``metronome_sdk.integrations.pipecat.MetronomeLLMService`` (extra ``[pipecat]``): a
  Pipecat ``LLMService`` on an in-process engine, one session per pipeline.
- ``metronome_sdk.integrations.livekit.MetronomeLLM`` (extra ``[livekit]``): a LiveKit
  Agents ``llm.LLM`` that talks to ``metronome serve``.

Each is imported by its own module path, so this package needs neither framework.
``Conversation`` drives a session with chat turns; ``error_mapping`` is the one table of
exception -> HTTP status / OpenAI error type / Pipecat category (docs/integrations.md).
"""

from ._conversation import Conversation, ReplyPiece, render_turns
from ._errors import ErrorMapping, error_mapping, retry_after_seconds

__all__ = ["Conversation", "ErrorMapping", "ReplyPiece", "error_mapping", "render_turns", "retry_after_seconds"]
