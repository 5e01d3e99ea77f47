"""What ``metronome serve`` listens on and accepts: frozen, keyword-only, checked when made."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field

from ..voice._admission import DEFAULT_OBJECTIVE

__all__ = ["RealtimeConfig", "ServeConfig", "check_replica_id"]

_REPLICA_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,62}")


def check_replica_id(value: object) -> None:
    """``ValueError`` unless ``value`` is a name fit for a header and a Prometheus label value."""
    if value is None:
        return
    if not isinstance(value, str) or not _REPLICA_ID.fullmatch(value):
        raise ValueError(
            f"replica_id must be 1-63 letters, digits, '.', '_' or '-' starting with a letter or digit, "
            f"got {value!r}; try the pod or host name"
        )


def _number(name: str, value: object, *, low: float, hint: str, open_low: bool = True) -> None:
    ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or (value <= low if open_low else value < low):  # type: ignore[operator]
        bound = f"> {low:g}" if open_low else f">= {low:g}"
        raise ValueError(f"{name} must be a finite number {bound}, got {value!r}; {hint}")


def _count(name: str, value: object, low: int, hint: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}; {hint}")


@dataclass(frozen=True, slots=True, kw_only=True)
class RealtimeConfig:
    """The ``/v1/realtime`` endpoint's voice and limits (docs/realtime.md).

    ``instructions``: the system prompt a connection starts with, until its first
    ``session.update`` names others (pinned: they can change only before the first turn).
    ``max_reply_tokens`` bounds each answer (a ``max_output_tokens`` below it lowers it);
    ``decode_tokens`` is each session's ``Session.decode_tokens`` (4: the voice's first
    clause is whole in fewer ticks). Limits on what a client sends: one
    ``input_audio_buffer.append`` carries at most ``max_append_seconds`` of audio (10 s
    of pcm16 at 24 kHz is 480 kB, 640 kB in base64; a larger WebSocket message is closed
    with code 1009), and the push-to-talk buffer (turn detection off) holds at most
    ``max_buffer_seconds``. ``send_timeout``: a client that stops reading for that long is
    disconnected and its session closed. ``audio_lead``: how far ahead of real time reply
    audio is sent, so that ``response.cancel`` and a barge-in cut what was not yet sent.
    ``semantic_silence``: under ``semantic_vad`` the words model (``TextTurn``) ends a turn at a
    short pause when the words read as finished; ``semantic_silence`` is the silence that ends the
    others (1 s: the words model ends most finished turns sooner, and a longer silence cuts fewer
    half-sentences; ``metronome eval turns``). ``server_vad`` keeps the turn detector's own (0.55 s).
    """

    instructions: str = "Answer the question in one short English sentence. Be factual and direct."
    max_reply_tokens: int = 48
    decode_tokens: int = 4
    max_append_seconds: float = 10.0
    max_buffer_seconds: float = 60.0
    send_timeout: float = 5.0
    audio_lead: float = 0.5
    semantic_silence: float = 1.0
    voice_objective: float | None = DEFAULT_OBJECTIVE

    def __post_init__(self) -> None:
        if self.voice_objective is not None:
            _number("voice_objective", self.voice_objective, low=0, hint="try 1.5 (seconds), or None")
        if not isinstance(self.instructions, str):
            raise ValueError(f"instructions must be a str, got {type(self.instructions).__name__}")
        _count("max_reply_tokens", self.max_reply_tokens, 1, "try 48")
        _count("decode_tokens", self.decode_tokens, 1, "4 suits speech")
        _number("max_append_seconds", self.max_append_seconds, low=0, hint="try 10 (seconds of audio)")
        _number("max_buffer_seconds", self.max_buffer_seconds, low=0, hint="try 60 (seconds of audio)")
        _number("send_timeout", self.send_timeout, low=0, hint="try 5 (seconds)")
        _number("audio_lead", self.audio_lead, low=0, open_low=False, hint="try 0.5 (seconds)")
        _number("semantic_silence", self.semantic_silence, low=0, hint="try 1.0 (seconds)")
        if self.semantic_silence > 10:
            raise ValueError(f"semantic_silence must be at most 10 seconds, got {self.semantic_silence!r}; try 1.0")

    @property
    def max_append_bytes(self) -> int:
        return round(self.max_append_seconds * 24000) * 2

    @property
    def max_message_bytes(self) -> int:
        """The largest WebSocket message taken: a full append in base64, and room for its JSON."""
        return self.max_append_bytes * 4 // 3 + 65536


@dataclass(frozen=True, slots=True, kw_only=True)
class ServeConfig:
    """The OpenAI-compatible server's address, limits and session policy.

    Security defaults are the signaling server's: it binds ``127.0.0.1``; with ``token``
    set every request needs ``Authorization: Bearer <token>`` (what the OpenAI client
    sends as its ``api_key``), compared in constant time; ``max_body`` caps a request
    body (a long chat history is tens of KiB, so 1 MiB by default).

    ``max_tokens`` is a reply's length when a request names none, ``max_tokens_limit``
    the most one may ask for. ``admission_wait``: how long a request waits for a free
    place under the admission cap before it is refused with 429 (0: refuse at once, and
    let the client wait the ``retry-after-ms`` it is told). ``idle_timeout``: a named
    session (``X-Metronome-Session``) with no request for that long is closed and its
    blocks go back to the pool. ``decode_tokens``: the tokens a session decodes per tick
    (``Session.decode_tokens``; more streams text faster than one token a tick, at the
    cost of a longer step). ``stall_retry_after``: the wait advised with a 503 when
    the engine stalled before the first token. ``model`` is the name responses carry.
    ``replica_id``: this server's name as one replica of many (``X-Metronome-Replica`` on
    every response, a ``replica`` label on every metric; docs/serving-many.md).
    ``realtime``: serve ``/v1/realtime`` (the OpenAI Realtime API: speech in, speech out)
    with these settings; ``None`` serves chat completions only and loads no voice.
    """

    host: str = "127.0.0.1"
    port: int = 8000
    token: str | None = field(default=None, repr=False)
    max_body: int = 1 << 20
    max_tokens: int = 128
    max_tokens_limit: int = 1024
    admission_wait: float = 0.0
    idle_timeout: float = 120.0
    stall_retry_after: float = 1.0
    decode_tokens: int = 1
    model: str = "metronome"
    replica_id: str | None = None
    realtime: RealtimeConfig | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.host, str) or not self.host:
            raise ValueError(f"host must be an address to bind, got {self.host!r}; try '127.0.0.1'")
        if isinstance(self.port, bool) or not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            raise ValueError(f"port must be an int in [0, 65535], got {self.port!r}; 0 picks a free port")
        if self.token is not None and (not isinstance(self.token, str) or len(self.token) < 8):
            raise ValueError("token must be a str of at least 8 characters (or None for no token)")
        _count("max_body", self.max_body, 1024, "try 1048576 (1 MiB)")
        _count("max_tokens", self.max_tokens, 1, "try 128")
        _count("max_tokens_limit", self.max_tokens_limit, 1, "try 1024")
        if self.max_tokens > self.max_tokens_limit:
            raise ValueError(f"max_tokens={self.max_tokens} exceeds max_tokens_limit={self.max_tokens_limit}")
        _number("admission_wait", self.admission_wait, low=0, open_low=False, hint="0 refuses at once with 429")
        _number("idle_timeout", self.idle_timeout, low=0, hint="try 120 (seconds)")
        _count("decode_tokens", self.decode_tokens, 1, "1 decodes one token a tick, 4 suits speech")
        _number("stall_retry_after", self.stall_retry_after, low=0, hint="try 1.0 (seconds)")
        if not isinstance(self.model, str) or not self.model:
            raise ValueError(f"model must be a non-empty str, got {self.model!r}")
        check_replica_id(self.replica_id)
        if self.realtime is not None and not isinstance(self.realtime, RealtimeConfig):
            raise ValueError(f"realtime must be a RealtimeConfig or None, got {type(self.realtime).__name__}")

    def __repr__(self) -> str:
        token = "set" if self.token else "none"
        return (
            f"ServeConfig(host={self.host!r}, port={self.port}, token={token}, max_body={self.max_body}, "
            f"max_tokens={self.max_tokens}/{self.max_tokens_limit}, idle_timeout={self.idle_timeout:g}s)"
        )
