"""Which tokens a session keeps resident in the KV cache.

``full`` keeps every token (what serving engines do today: unbounded).
``window(W, sinks=S)`` keeps the first ``S`` tokens pinned (attention sinks) and the
last ``W`` tokens; everything between leaves the cache and its blocks go back to the
pool at once, so a session's footprint is bounded whatever its length.
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

    @property
    def num_sinks(self) -> int:
        return self.sinks

    def span(self, t: int) -> tuple[int, int]:
        """For the query at stream index ``t``: ``(n_sinks, window_start)``.

        The query attends to stream tokens ``[0, n_sinks)`` and ``[window_start, t]``.
        """
        if self.window is None:
            return 0, 0
        n_sinks = min(self.sinks, t + 1)
        return n_sinks, max(self.sinks, t - self.window + 1)

    def max_blocks(self, block_size: int, *, chunk: int = 1) -> int | None:
        """Most blocks one session can hold while a step appends ``chunk`` tokens.

        ``None`` for the full policy (unbounded). For a decode step (``chunk=1``) this is
        ``ceil(S/bs) + ceil(W/bs) + 1``; a longer chunk keeps the earliest query's window
        resident until the step ends, so it widens the window by ``chunk - 1`` tokens.
        """
        if self.window is None:
            return None
        if chunk < 1:
            raise ValueError(f"chunk must be >= 1, got {chunk}")
        return math.ceil(self.sinks / block_size) + math.ceil((self.window + chunk - 1) / block_size) + 1

    def __repr__(self) -> str:
        if self.window is None:
            return "KVPolicy.full()"
        return f"KVPolicy.windowed({self.window}, sinks={self.sinks})"
