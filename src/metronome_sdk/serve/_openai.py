"""The OpenAI chat-completions wire format: requests checked in, responses and errors shaped out.

Pure functions over JSON values, no I/O, so every shape is unit-tested on its own.
A request that cannot be served is a ``ValueError`` naming the field (answered 400).
"""

from __future__ import annotations

import json
import re
import time
import uuid
from dataclasses import dataclass
from typing import Any

from .._stats import SessionStats
from ..integrations._errors import ErrorMapping

__all__ = [
    "CONTEXT_FIELD",
    "ChatRequest",
    "completion",
    "context_field",
    "context_headers",
    "error_body",
    "parse_request",
    "stream_chunk",
]

SESSION_HEADER = "X-Metronome-Session"
SESSION_FIELD = "metronome_session"
CONTEXT_FIELD = "metronome"  # the last stream chunk's extra field: OpenAI clients keep unknown fields
_SESSION_KEY = re.compile(r"^[A-Za-z0-9._:@-]{1,128}$")
# accepted and not applied: a session samples as it was opened (see docs/serve.md)
_IGNORED = {
    "model",
    "temperature",
    "top_p",
    "presence_penalty",
    "frequency_penalty",
    "user",
    "seed",
    "stop",
    "logit_bias",
    "parallel_tool_calls",
    "service_tier",
    "store",
    "metadata",
}


@dataclass(frozen=True, slots=True)
class ChatRequest:
    messages: tuple[dict[str, str], ...]  # role and text content, in order
    stream: bool
    include_usage: bool
    max_tokens: int
    session_key: str | None


def parse_request(
    body: bytes, *, header_key: str | None, default_max_tokens: int, max_tokens_limit: int
) -> ChatRequest:
    """The request in ``body``, or a ``ValueError`` that says what is wrong with it."""
    try:
        data = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        raise ValueError("the body must be a JSON object (a chat completion request)") from None
    if not isinstance(data, dict):
        raise ValueError("the body must be a JSON object (a chat completion request)")
    messages = _messages(data.get("messages"))
    stream = data.get("stream", False)
    if not isinstance(stream, bool):
        raise ValueError(f"stream must be true or false, got {stream!r}")
    options = data.get("stream_options")
    include_usage = False
    if options is not None:
        if not isinstance(options, dict) or not isinstance(options.get("include_usage", False), bool):
            raise ValueError("stream_options must be an object like {'include_usage': true}")
        include_usage = bool(options.get("include_usage", False))
    max_tokens = _max_tokens(data, default_max_tokens, max_tokens_limit)
    n = data.get("n", 1)
    if n != 1:
        raise ValueError(f"n must be 1 (one reply per request), got {n!r}")
    if data.get("tools") or data.get("functions"):
        raise ValueError("tools are not supported by this server: send messages only")
    unknown = set(data) - _IGNORED - {"messages", "stream", "stream_options", "max_tokens", "max_completion_tokens"}
    unknown -= {"n", "tools", "tool_choice", "functions", "function_call", SESSION_FIELD}
    if unknown:
        raise ValueError(f"unknown fields {sorted(unknown)}; see docs/serve.md for what the server takes")
    return ChatRequest(messages, stream, include_usage, max_tokens, _session_key(data.get(SESSION_FIELD), header_key))


def _messages(raw: object) -> tuple[dict[str, str], ...]:
    if not isinstance(raw, list) or not raw:
        raise ValueError("messages must be a non-empty list of {'role': ..., 'content': ...}")
    out = []
    for i, m in enumerate(raw):
        if not isinstance(m, dict):
            raise ValueError(f"messages[{i}] must be an object with role and content")
        role = m.get("role")
        if role == "developer":  # the newer name of the system role
            role = "system"
        if role not in ("system", "user", "assistant"):
            raise ValueError(f"messages[{i}].role must be system, user or assistant, got {role!r}")
        out.append({"role": role, "content": _text(m.get("content"), i)})
    return tuple(out)


def _text(content: object, i: int) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise ValueError(f"messages[{i}].content parts must be text parts {{'type': 'text', 'text': ...}}")
            parts.append(part["text"])
        return "".join(parts)
    raise ValueError(f"messages[{i}].content must be a string or a list of text parts")


def _max_tokens(data: dict[str, Any], default: int, limit: int) -> int:
    value = data.get("max_completion_tokens", data.get("max_tokens"))
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= limit:
        raise ValueError(f"max_tokens must be an int in [1, {limit}], got {value!r}")
    return value


def _session_key(field: object, header: str | None) -> str | None:
    if field is not None and not isinstance(field, str):
        raise ValueError(f"{SESSION_FIELD} must be a string, got {type(field).__name__}")
    if field is not None and header is not None and field != header:
        raise ValueError(f"the {SESSION_HEADER} header and the {SESSION_FIELD} field name different sessions")
    key = header if header is not None else field
    if key is not None and not _SESSION_KEY.match(key):
        raise ValueError(f"a session key is 1-128 characters of letters, digits and . _ : @ -, got {key[:40]!r}")
    return key


# responses -----------------------------------------------------------------------------------------


def new_id() -> str:
    return f"chatcmpl-{uuid.uuid4().hex[:24]}"


def completion(
    *, id: str, model: str, text: str, finish_reason: str, prompt_tokens: int, completion_tokens: int
) -> dict[str, Any]:
    return {
        "id": id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "message": {"role": "assistant", "content": text}, "finish_reason": finish_reason}],
        "usage": usage(prompt_tokens, completion_tokens),
    }


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def stream_chunk(
    *, id: str, model: str, created: int, delta: dict[str, str], finish_reason: str | None = None
) -> dict[str, Any]:
    return {
        "id": id,
        "object": "chat.completion.chunk",
        "created": created,
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
    }


def error_body(row: ErrorMapping, message: str, *, retry_after: float | None = None) -> dict[str, Any]:
    """OpenAI's error shape; ``code`` names the SDK exception, ``retry_after`` is in seconds."""
    error: dict[str, Any] = {"message": message, "type": row.openai_type, "param": None, "code": row.exception}
    if retry_after is not None:
        error["retry_after"] = round(retry_after, 3)
    return {"error": error}


def context_field(stats: SessionStats) -> dict[str, Any]:
    """What the session's model still sees after a reply, as the last stream chunk's extra field.

    The same facts as ``context_headers``, which a stream cannot send: its headers went out
    before the reply was decoded (docs/sessions.md, "What the agent still sees").
    """
    return {
        CONTEXT_FIELD: {
            "evicted_tokens": stats.evicted_tokens,
            "oldest_resident_turn": stats.oldest_resident_turn,
            "system_prompt_resident": stats.system_prompt_resident,
        }
    }


def context_headers(stats: SessionStats) -> dict[str, str]:
    """What the session's model still sees after a reply, as a non-streamed reply's headers."""
    headers = {
        "x-metronome-evicted-tokens": str(stats.evicted_tokens),
        "x-metronome-system-prompt-resident": "true" if stats.system_prompt_resident else "false",
    }
    if stats.oldest_resident_turn is not None:  # absent when no turn is whole
        headers["x-metronome-oldest-resident-turn"] = str(stats.oldest_resident_turn)
    return headers
