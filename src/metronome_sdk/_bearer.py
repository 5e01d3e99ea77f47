"""The bearer-token check both HTTP servers (signaling and ``metronome serve``) make."""

from __future__ import annotations

import hmac

__all__: list[str] = []  # internal: bearer_matches


def bearer_matches(authorization: str, token: str | None) -> bool:
    """Whether an ``Authorization`` header value carries ``token`` as a bearer; no token, no check."""
    if token is None:
        return True
    scheme, _, given = authorization.partition(" ")
    # always compare, in constant time, so timing tells nothing about the token; aiohttp keeps
    # odd header bytes as surrogates, hence the encoding
    matches = hmac.compare_digest(given.strip().encode("utf-8", "surrogateescape"), token.encode())
    return matches and scheme.lower() == "bearer"
