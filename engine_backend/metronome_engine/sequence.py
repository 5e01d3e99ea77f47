"""One session's view of the block pool: its block table and its length.

Pure Python. The engine asks it for slots before a step (``reserve``), then
advances it after the step (``commit``), which frees the blocks that left the
window at once. A *hold* (``hold``) keeps what the stream saw at one length
resident while it goes on, for at most ``limit`` more tokens, so that it can go
back there exactly (``rewind``): the tokens after it were tentative.
"""

from __future__ import annotations

from .block_pool import BlockPool
from .kv_policy import KVPolicy

__all__ = ["SequenceKV"]


class SequenceKV:
    __slots__ = ("_held", "_pool", "_table", "block_size", "num_tokens", "pinned", "policy", "seq_id")

    def __init__(self, seq_id: int, policy: KVPolicy, pool: BlockPool, *, pinned: int = 0) -> None:
        self.seq_id = seq_id
        self.policy = policy
        # first tokens that never leave the cache: the sinks, or a longer pinned prefix
        self.pinned = policy.pinned_tokens(pinned)
        self.block_size = pool.block_size
        self._pool = pool
        self.num_tokens = 0  # tokens appended so far; the next one has stream index num_tokens
        self._table: dict[int, int] = {}  # logical block -> physical block
        self._held: tuple[int, int] | None = None  # (length held, most tokens past it) while a hold lasts

    @property
    def num_blocks(self) -> int:
        return len(self._table)

    def blocks_needed(self, n: int) -> int:
        """New blocks that appending ``n`` tokens would take from the pool."""
        if n <= 0:
            return 0
        bs = self.block_size
        first = self.num_tokens // bs
        last = (self.num_tokens + n - 1) // bs
        return sum(1 for lb in range(first, last + 1) if lb not in self._table)

    def reserve(self, n: int) -> bool:
        """Take the blocks for ``n`` new tokens; ``False`` (taking nothing) if the pool is full.

        A hold that these tokens would take past its limit lapses first: the blocks it kept
        go back, so that a held stream never holds more than its limit's worth beyond its bound.
        """
        if self._held is not None and self.num_tokens + n - self._held[0] > self._held[1]:
            self._held = None
            self._evict()
        need = self.blocks_needed(n)
        got = self._pool.allocate(need)
        if got is None:
            return False
        if need:
            bs = self.block_size
            missing = [
                lb for lb in range(self.num_tokens // bs, (self.num_tokens + n - 1) // bs + 1) if lb not in self._table
            ]
            self._table.update(zip(missing, got, strict=True))
        return True

    def rollback(self) -> None:
        """Give back blocks reserved past ``num_tokens`` (a step that did not happen)."""
        bs = self.block_size
        spare = [lb for lb in self._table if lb * bs >= self.num_tokens]
        self._pool.free(self._table.pop(lb) for lb in spare)

    def commit(self, n: int) -> None:
        """Count ``n`` appended tokens and free every block that left the window."""
        self.num_tokens += n
        self._evict()

    # going back -----------------------------------------------------------------------------------

    @property
    def held(self) -> int | None:
        """The stream length a hold keeps resident (``None``: no hold, or it lapsed)."""
        return self._held[0] if self._held is not None else None

    def hold(self, limit: int) -> None:
        """Keep what the stream sees now resident for up to ``limit`` more tokens (replaces a hold)."""
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ValueError(f"limit must be an int >= 1 (tokens), got {limit!r}")
        self._held = (self.num_tokens, limit)

    def release_hold(self) -> None:
        """End the hold: blocks it kept leave at the next ``commit``, as the window says."""
        self._held = None

    def rewind(self, length: int) -> None:
        """Go back to stream length ``length``, which a hold keeps resident; the tokens after it are gone.

        ``ValueError`` when no hold covers it (none was taken, it lapsed, or ``length`` is
        before it or past the stream's end). The hold stays, at ``length``.
        """
        held = self._held
        if held is None or not held[0] <= length <= self.num_tokens:
            where = "no hold (none was taken, or it lapsed)" if held is None else f"a hold at {held[0]}"
            raise ValueError(
                f"seq_id={self.seq_id} cannot go back to {length} tokens: it has {self.num_tokens} and {where}"
            )
        self.num_tokens = length
        self._held = (length, held[1])
        bs = self.block_size
        past = [lb for lb in self._table if lb * bs >= length]  # blocks wholly after the new end
        self._pool.free(self._table.pop(lb) for lb in past)

    def _evict(self) -> None:
        if not self.policy.bounded:
            return
        bs = self.block_size
        # span of the next query; a hold keeps the span of the length it holds
        length = self.num_tokens if self._held is None else min(self.num_tokens, self._held[0])
        _, window_start = self.policy.span(length, pinned=self.pinned)
        gone = [lb for lb in self._table if lb * bs >= self.pinned and (lb + 1) * bs <= window_start]
        if gone:
            self._pool.free(self._table.pop(lb) for lb in gone)

    def slot(self, j: int) -> int:
        """Global pool slot of the token at stream index ``j`` (which must be resident)."""
        bs = self.block_size
        return self._table[j // bs] * bs + j % bs

    def slots(self, start: int, stop: int) -> list[int]:
        bs = self.block_size
        table = self._table
        return [table[j // bs] * bs + j % bs for j in range(start, stop)]

    def resident_blocks(self) -> list[tuple[int, int]]:
        """``(logical, physical)`` of every block held, in stream order."""
        return sorted(self._table.items())

    @property
    def evicted_tokens(self) -> int:
        """Tokens between the pinned prefix and the window that the last token no longer saw."""
        return self.policy.evicted(self.num_tokens, pinned=self.pinned)

    def release(self) -> None:
        """Return every block to the pool (the session ended)."""
        self._pool.free(self._table.values())
        self._table.clear()

    def __repr__(self) -> str:
        return (
            f"SequenceKV(seq_id={self.seq_id}, tokens={self.num_tokens}, pinned={self.pinned}, "
            f"blocks={self.num_blocks})"
        )
