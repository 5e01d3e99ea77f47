"""The OpenAI Realtime API's wire format as ``/v1/realtime`` speaks it: pure values and checks, no I/O.

Event names and shapes are the ones the ``openai`` client (3.x, ``openai/types/realtime/``)
sends and parses; the older beta spellings a client may still send (``modalities``,
``input_audio_format: "pcm16"``, ``voice`` at the top of the session) are read too. Audio is
pcm16, 24 kHz, mono, base64 on the wire, both ways: any other format is refused.

Every refusal is a ``RealtimeProtocolError`` carrying the ``code`` and ``param`` its ``error``
event names; the connection sends it and goes on (nothing a client sends closes the socket
but an oversized message, which is WebSocket close code 1009).
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import json
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from .._exceptions import Overloaded
from ..integrations._errors import error_mapping, rows

__all__: list[str] = []  # internal: the endpoint's wire format

RATE = 24000  # the API's pcm16 rate, in and out
FORMAT: dict[str, Any] = {"type": "audio/pcm", "rate": RATE}
TurnDetection = Literal["server_vad", "semantic_vad"] | None
Modality = Literal["audio", "text"]

# what a client may send; anything else is an `unknown_event` error
CLIENT_EVENTS = frozenset(
    {
        "session.update",
        "input_audio_buffer.append",
        "input_audio_buffer.commit",
        "input_audio_buffer.clear",
        "conversation.item.create",
        "conversation.item.truncate",
        "conversation.item.delete",
        "conversation.item.retrieve",
        "response.create",
        "response.cancel",
        "output_audio_buffer.clear",
    }
)


class RealtimeProtocolError(ValueError):
    """A client event the endpoint cannot take; sent back as an ``error`` event, the connection goes on."""

    def __init__(self, code: str, message: str, *, param: str | None = None, event_id: str | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.param = param
        self.event_id = event_id


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:20]}"


def server_event(type: str, **fields: Any) -> dict[str, Any]:
    return {"type": type, "event_id": new_id("event"), **fields}


def error_event(
    code: str,
    message: str,
    *,
    type: str = "invalid_request_error",
    param: str | None = None,
    event_id: str | None = None,
    retry_after: float | None = None,
) -> dict[str, Any]:
    """The API's ``error`` event; ``retry_after`` (seconds, an extra field) says when to try again."""
    error: dict[str, Any] = {"type": type, "code": code, "message": message, "param": param, "event_id": event_id}
    if retry_after is not None:
        error["retry_after"] = round(retry_after, 3)
    return server_event("error", error=error)


def protocol_error_event(exc: RealtimeProtocolError) -> dict[str, Any]:
    return error_event(exc.code, str(exc), param=exc.param, event_id=exc.event_id)


def _snake(name: str) -> str:
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


_BY_NAME = {row.exception: (cls, row) for cls, row in rows()}


def failure_code(name: str) -> tuple[str, str]:
    """The ``error`` event's ``code`` and ``type`` for an SDK exception, by its class name.

    Back-pressure (``Overloaded``: ``AdmissionRejected``, ``LoadShed``) is ``rate_limit_exceeded``,
    the code clients already retry on; the rest are the class name in snake case
    (``session_broken``, ``engine_stalled``, ``cache_exhausted``...), typed as in the HTTP table.
    """
    found = _BY_NAME.get(name)
    if found is None:
        return _snake(name), "server_error"
    cls, row = found
    return ("rate_limit_exceeded" if issubclass(cls, Overloaded) else _snake(name)), row.openai_type


def failure_event(exc: BaseException, *, retry_after: float | None = None) -> dict[str, Any]:
    """The ``error`` event for an exception of the SDK's tree (the agent's or the admission's)."""
    row = error_mapping(exc)
    code, kind = failure_code(type(exc).__name__ if row.exception == "InternalError" else row.exception)
    hint = retry_after if row.retryable else None
    if isinstance(exc, Overloaded):
        hint = exc.retry_after
    message = str(exc) or row.exception
    if hint is not None:
        message = f"{message} (retry after {hint:.2f} s)"
    return error_event(code, message, type=kind, retry_after=hint)


def parse_event(raw: str, *, max_chars: int) -> dict[str, Any]:
    """One client event: a JSON object with a known ``type``."""
    if len(raw) > max_chars:
        raise RealtimeProtocolError("event_too_large", f"an event may hold at most {max_chars} characters")
    try:
        event = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise RealtimeProtocolError("invalid_json", f"the message is not JSON: {str(exc)[:120]}") from None
    if not isinstance(event, dict):
        raise RealtimeProtocolError("invalid_event", "an event is a JSON object with a `type`")
    event_id = event.get("event_id") if isinstance(event.get("event_id"), str) else None
    kind = event.get("type")
    if not isinstance(kind, str):
        raise RealtimeProtocolError("invalid_event", "the event has no `type`", param="type", event_id=event_id)
    if kind not in CLIENT_EVENTS:
        known = ", ".join(sorted(CLIENT_EVENTS))
        raise RealtimeProtocolError(
            "unknown_event",
            f"unknown event type {kind[:80]!r}; this endpoint takes {known}",
            param="type",
            event_id=event_id,
        )
    return event


def decode_audio(data: object, *, max_bytes: int, event_id: str | None = None) -> npt.NDArray[np.int16]:
    """An append's ``audio``: base64 pcm16 (little-endian) to samples."""
    if not isinstance(data, str):
        raise RealtimeProtocolError("invalid_value", "`audio` must be base64 pcm16", param="audio", event_id=event_id)
    if len(data) * 3 // 4 > max_bytes:
        raise RealtimeProtocolError(
            "audio_too_large",
            f"one append may carry at most {max_bytes} bytes of audio ({max_bytes / 2 / RATE:g} s at 24 kHz); "
            "send it in smaller pieces",
            param="audio",
            event_id=event_id,
        )
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError):
        raise RealtimeProtocolError(
            "invalid_value", "`audio` is not valid base64", param="audio", event_id=event_id
        ) from None
    if len(raw) % 2:
        raise RealtimeProtocolError(
            "invalid_value", "pcm16 audio has an even number of bytes", param="audio", event_id=event_id
        )
    return np.frombuffer(raw, dtype="<i2").astype(np.int16)


def encode_audio(samples: npt.NDArray[np.int16]) -> str:
    return base64.b64encode(samples.astype("<i2").tobytes()).decode("ascii")


def _format_ok(value: object) -> bool:
    if value == "pcm16":  # the beta API's name for the same format
        return True
    if not isinstance(value, Mapping):
        return False
    return value.get("type") in ("audio/pcm", "pcm16") and value.get("rate", RATE) == RATE


@dataclass(frozen=True, slots=True)
class SessionSettings:
    """What ``session.update`` sets: the pinned instructions, the voice, turn detection, output kind."""

    instructions: str
    voice: str = "joe"
    output: Modality = "audio"
    turn_detection: TurnDetection = "server_vad"
    interrupt_response: bool = True
    max_output_tokens: int | None = None
    transcription_model: str = "whisper-tiny.en"

    def update(self, session: object, *, event_id: str | None = None) -> SessionSettings:
        """These settings with ``session``'s applied; nothing is applied if one value is refused."""

        def refuse(code: str, param: str, message: str) -> RealtimeProtocolError:
            return RealtimeProtocolError(code, message, param=f"session.{param}", event_id=event_id)

        if not isinstance(session, Mapping):
            raise RealtimeProtocolError("invalid_value", "`session` must be an object", param="session")
        changes: dict[str, Any] = {}
        if session.get("type", "realtime") != "realtime":
            raise refuse("unsupported_value", "type", "only `realtime` sessions are served (no transcription-only)")
        if "instructions" in session:
            if not isinstance(session["instructions"], str):
                raise refuse("invalid_value", "instructions", "`instructions` must be a string")
            changes["instructions"] = session["instructions"]
        modalities = session.get("output_modalities", session.get("modalities"))
        if modalities is not None:
            if not isinstance(modalities, list) or not modalities or not set(modalities) <= {"audio", "text"}:
                raise refuse("invalid_value", "output_modalities", 'output_modalities must be ["audio"] or ["text"]')
            changes["output"] = "audio" if "audio" in modalities else "text"
        tools = session.get("tools")
        if tools:
            raise refuse("unsupported_value", "tools", "tools (function calling, MCP) are not supported here")
        if session.get("prompt"):
            raise refuse("unsupported_value", "prompt", "stored prompts are not supported; send `instructions`")
        audio = session.get("audio") or {}
        if not isinstance(audio, Mapping):
            raise refuse("invalid_value", "audio", "`audio` must be an object")
        inp = audio.get("input") or {}
        out = audio.get("output") or {}
        if not isinstance(inp, Mapping) or not isinstance(out, Mapping):
            raise refuse("invalid_value", "audio", "`audio.input` and `audio.output` must be objects")
        for param, value in (
            ("audio.input.format", inp.get("format")),
            ("audio.output.format", out.get("format")),
            ("input_audio_format", session.get("input_audio_format")),
            ("output_audio_format", session.get("output_audio_format")),
        ):
            if value is not None and not _format_ok(value):
                raise refuse(
                    "unsupported_audio_format",
                    param,
                    f"{param} {json.dumps(value)[:80]} is not served: only pcm16 at 24 kHz mono "
                    '({"type": "audio/pcm", "rate": 24000})',
                )
        voice = out.get("voice", session.get("voice"))
        if voice is not None:
            if not isinstance(voice, str | Mapping):
                raise refuse("invalid_value", "audio.output.voice", "`voice` must be a name")
            changes["voice"] = voice if isinstance(voice, str) else str(voice.get("id", self.voice))
        turn = inp["turn_detection"] if "turn_detection" in inp else session.get("turn_detection", ...)
        if turn is not ...:
            changes.update(_turn_detection(turn, refuse))
        transcription = inp.get("transcription", session.get("input_audio_transcription"))
        if isinstance(transcription, Mapping) and isinstance(transcription.get("model"), str):
            changes["transcription_model"] = transcription["model"]
        limit = session.get("max_output_tokens", session.get("max_response_output_tokens"))
        if limit is not None:
            if limit == "inf":
                changes["max_output_tokens"] = None
            elif isinstance(limit, int) and not isinstance(limit, bool) and limit >= 1:
                changes["max_output_tokens"] = limit
            else:
                raise refuse("invalid_value", "max_output_tokens", 'max_output_tokens must be an int >= 1 or "inf"')
        return dataclasses.replace(self, **changes)

    def as_session(self, session_id: str, model: str) -> dict[str, Any]:
        """The session object of ``session.created`` / ``session.updated``."""
        turn: dict[str, Any] | None = None
        if self.turn_detection == "server_vad":
            turn = {"type": "server_vad", "create_response": True, "interrupt_response": self.interrupt_response}
        elif self.turn_detection == "semantic_vad":
            turn = {"type": "semantic_vad", "create_response": True, "interrupt_response": self.interrupt_response}
        return {
            "type": "realtime",
            "object": "realtime.session",
            "id": session_id,
            "model": model,
            "output_modalities": [self.output],
            "instructions": self.instructions,
            "audio": {
                "input": {
                    "format": dict(FORMAT),
                    "transcription": {"model": self.transcription_model},
                    "turn_detection": turn,
                    "noise_reduction": None,
                },
                "output": {"format": dict(FORMAT), "voice": self.voice, "speed": 1.0},
            },
            "tools": [],
            "tool_choice": "auto",
            "max_output_tokens": self.max_output_tokens if self.max_output_tokens is not None else "inf",
        }


def _turn_detection(turn: object, refuse: Any) -> dict[str, Any]:
    if turn is None or turn is False:
        return {"turn_detection": None}
    if not isinstance(turn, Mapping) or turn.get("type") not in ("server_vad", "semantic_vad"):
        raise refuse(
            "invalid_value", "audio.input.turn_detection", "turn_detection is server_vad, semantic_vad or null"
        )
    if turn.get("create_response") is False:
        raise refuse(
            "unsupported_value",
            "audio.input.turn_detection.create_response",
            "create_response false is not supported: with turn detection every turn is answered "
            "(use turn_detection null and response.create to choose)",
        )
    interrupt = turn.get("interrupt_response", True)
    return {"turn_detection": turn["type"], "interrupt_response": interrupt is not False}


def message_item(
    item_id: str, role: str, content: list[dict[str, Any]], *, status: str = "completed"
) -> dict[str, Any]:
    return {
        "id": item_id,
        "object": "realtime.item",
        "type": "message",
        "status": status,
        "role": role,
        "content": content,
    }


def user_text(event: Mapping[str, Any]) -> tuple[str, str]:
    """A ``conversation.item.create``'s item id and text: a user message of ``input_text`` parts."""
    event_id = event.get("event_id") if isinstance(event.get("event_id"), str) else None
    item = event.get("item")
    if not isinstance(item, Mapping):
        raise RealtimeProtocolError("invalid_value", "`item` must be an object", param="item", event_id=event_id)
    if item.get("type", "message") != "message":
        raise RealtimeProtocolError(
            "unsupported_value",
            f"items of type {str(item.get('type'))[:40]!r} are not supported (no tools): send user messages",
            param="item.type",
            event_id=event_id,
        )
    if item.get("role") != "user":
        raise RealtimeProtocolError(
            "unsupported_value",
            "only user messages may be added (the model's own turns are its replies; instructions go in "
            "session.update)",
            param="item.role",
            event_id=event_id,
        )
    content = item.get("content")
    if not isinstance(content, list) or not content:
        raise RealtimeProtocolError("invalid_value", "`item.content` must be a list of parts", param="item.content")
    texts = []
    for part in content:
        if not isinstance(part, Mapping) or part.get("type") not in ("input_text", "text"):
            kind = part.get("type") if isinstance(part, Mapping) else part
            raise RealtimeProtocolError(
                "unsupported_value",
                f"content parts of type {str(kind)[:40]!r} are not supported: send input_text (no images, "
                "no input_audio items; stream audio with input_audio_buffer.append)",
                param="item.content",
                event_id=event_id,
            )
        text = part.get("text")
        if not isinstance(text, str):
            raise RealtimeProtocolError("invalid_value", "an input_text part needs `text`", param="item.content")
        texts.append(text)
    item_id = item.get("id") if isinstance(item.get("id"), str) and item.get("id") else new_id("item")
    return str(item_id), "\n".join(texts)


def rate_limits(
    *, sessions: int, limit: int, pool_blocks: int, used_blocks: int, block_size: int
) -> list[dict[str, Any]]:
    """Admission headroom: ``requests`` is sessions under the cap, ``tokens`` the KV pool's free tokens."""
    return [
        {"name": "requests", "limit": limit, "remaining": max(0, limit - sessions), "reset_seconds": 0.0},
        {
            "name": "tokens",
            "limit": pool_blocks * block_size,
            "remaining": max(0, pool_blocks - used_blocks) * block_size,
            "reset_seconds": 0.0,
        },
    ]
