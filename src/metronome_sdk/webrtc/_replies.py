"""The signaling server's answers to bad input: a status and a JSON reason, never a 500 or a traceback."""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web

from .._log import get_logger

__all__ = ["json_errors", "parse_offer", "refuse", "retry_after_header", "short_reason"]


def refuse(status: int, error: str, message: str, headers: dict[str, str] | None = None) -> web.Response:
    return web.json_response({"error": error, "message": message}, status=status, headers=headers)


def retry_after_header(seconds: float) -> dict[str, str]:
    return {"Retry-After": str(max(1, math.ceil(seconds)))}


@web.middleware
async def json_errors(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> Any:
    try:
        return await handler(request)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        keep = {k: v for k, v in exc.headers.items() if k.lower() in ("allow", "retry-after", "www-authenticate")}
        return refuse(exc.status, exc.reason.lower().replace(" ", "_"), exc.reason, keep)
    except asyncio.CancelledError:
        raise
    except Exception:  # a bug of ours: logged here, never shown to the client
        get_logger().exception("webrtc.request_failed", path=request.path)
        return refuse(500, "internal_error", "the server failed to handle this request; see its log")


def short_reason(exc: BaseException) -> str:
    text = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return text[:200]


def parse_offer(body: bytes) -> str | web.Response:
    """The offer's SDP, or the 400 that says why the body is not an offer."""
    try:
        offer = json.loads(body)
    except (ValueError, UnicodeDecodeError):
        return refuse(400, "bad_request", 'the body must be JSON: {"sdp": "...", "type": "offer"}')
    if not isinstance(offer, dict) or offer.get("type") != "offer" or not isinstance(offer.get("sdp"), str):
        return refuse(400, "bad_request", 'the body must be {"sdp": "<an SDP offer>", "type": "offer"}')
    sdp: str = offer["sdp"]
    if not sdp.startswith("v=0") or "\nm=" not in sdp:
        return refuse(400, "bad_offer", "the sdp is not a session description (it starts with v=0 and has m= lines)")
    from aiortc.sdp import SessionDescription

    try:
        SessionDescription.parse(sdp)
    except Exception as exc:  # aiortc's parser raises whatever the text trips
        return refuse(400, "bad_offer", f"the sdp cannot be parsed: {short_reason(exc)}")
    return sdp
