"""Which tokens a session keeps resident in the KV cache.

``full`` keeps every token (what serving engines do today: unbounded).
``window(W, sinks=S)`` keeps the first ``S`` tokens pinned (attention sinks) and the
last ``W`` tokens; everything between leaves the cache and its blocks go back to the
pool at once, so a session's footprint is bounded whatever its length.

A session may pin a longer prefix of its own (its system prompt): ``pinned=P`` keeps
its first ``P`` tokens resident too. The sinks are the stream's first tokens, so they
lie inside such a prefix: a session keeps its first ``max(S, P)`` tokens, and the
window of ``W`` tokens follows them. In-cache positions run ``0..max(S, P)-1`` over the
pinned tokens and on from there over the window.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

__all__ = ["KVPolicy"]


@dataclass(frozen=True, slots=True, kw_only=True)
class KVPolicy:
    kind: Literal["full", "window"]
    window: int | None = None
    sinks: int = 0

    def __post_init__(self) -> None:
        if self.kind not in ("full", "window"):
            raise ValueError(f"kind must be 'full' or 'window', got {self.kind!r}")
        if self.kind == "full":
            if self.window is not None or self.sinks != 0:
                raise ValueError("a full policy keeps every token: leave window=None and sinks=0")
            return
        if isinstance(self.window, bool) or not isinstance(self.window, int) or self.window < 1:
            raise ValueError(f"window must be an int >= 1, got {self.window!r}; try window=256")
        if isinstance(self.sinks, bool) or not isinstance(self.sinks, int) or self.sinks < 0:
            raise ValueError(f"sinks must be an int >= 0, got {self.sinks!r}; 4 sinks is the usual choice")

    @classmethod
    def full(cls) -> KVPolicy:
        return cls(kind="full")

    @classmethod
    def windowed(cls, window: int, *, sinks: int = 4) -> KVPolicy:
        return cls(kind="window", window=window, sinks=sinks)

    @property
    def bounded(self) -> bool:
        return self.kind == "window"

    def pinned_tokens(self, pinned: int = 0) -> int:
        """How many first tokens a session with a pinned prefix of ``pinned`` tokens keeps.

        ``max(S, pinned)`` under a window (the sinks are the prefix's first tokens);
        0 under the full policy, which keeps every token anyway.
        """
        if isinstance(pinned, bool) or not isinstance(pinned, int) or pinned < 0:
            raise ValueError(f"pinned must be an int >= 0 (tokens), got {pinned!r}")
        if self.window is None:
            return 0
        return max(self.sinks, pinned)

    def span(self, t: int, *, pinned: int = 0) -> tuple[int, int]:
        """For the query at stream index ``t``: ``(n_pinned, window_start)``.

        The query attends to stream tokens ``[0, n_pinned)`` (the sinks, or the pinned
        prefix when it is longer) and ``[window_start, t]``.
        """
        if self.window is None:
            return 0, 0
        p = self.pinned_tokens(pinned)
        return min(p, t + 1), max(p, t - self.window + 1)

    def evicted(self, num_tokens: int, *, pinned: int = 0) -> int:
        """Tokens of a stream of ``num_tokens`` that its last token no longer saw: those
        between the pinned prefix and the window. Always 0 under the full policy."""
        if self.window is None:
            return 0
        return max(0, num_tokens - self.window - self.pinned_tokens(pinned))

    def max_blocks(self, block_size: int, *, chunk: int = 1, pinned: int = 0) -> int | None:
        """Most blocks one session can hold while a step appends ``chunk`` tokens.

        ``None`` for the full policy (unbounded). For a decode step (``chunk=1``) this is
        ``ceil(P/bs) + ceil(W/bs) + 1`` with ``P = max(S, pinned)``; a longer chunk keeps
        the earliest query's window resident until the step ends, so it widens the window
        by ``chunk - 1`` tokens.
        """
        if self.window is None:
            return None
        if chunk < 1:
            raise ValueError(f"chunk must be >= 1, got {chunk}")
        p = self.pinned_tokens(pinned)
        return math.ceil(p / block_size) + math.ceil((self.window + chunk - 1) / block_size) + 1

    def __repr__(self) -> str:
        if self.window is None:
            return "KVPolicy.full()"
        return f"KVPolicy.windowed({self.window}, sinks={self.sinks})"
