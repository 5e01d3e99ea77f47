"""One session's view of the block pool: its block table and its length.

Pure Python. The engine asks it for slots before a step (``reserve``), then
advances it after the step (``commit``), which frees the blocks that left the
window at once.
"""

from __future__ import annotations

from .block_pool import BlockPool
from .kv_policy import KVPolicy

__all__ = ["SequenceKV"]


class SequenceKV:
    __slots__ = ("_pool", "_table", "block_size", "num_tokens", "pinned", "policy", "seq_id")

    def __init__(self, seq_id: int, policy: KVPolicy, pool: BlockPool, *, pinned: int = 0) -> None:
        self.seq_id = seq_id
        self.policy = policy
        # first tokens that never leave the cache: the sinks, or a longer pinned prefix
        self.pinned = policy.pinned_tokens(pinned)
        self.block_size = pool.block_size
        self._pool = pool
        self.num_tokens = 0  # tokens appended so far; the next one has stream index num_tokens
        self._table: dict[int, int] = {}  # logical block -> physical block

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
        """Take the blocks for ``n`` new tokens; ``False`` (taking nothing) if the pool is full."""
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

    def _evict(self) -> None:
        if not self.policy.bounded:
            return
        bs = self.block_size
        _, window_start = self.policy.span(self.num_tokens, pinned=self.pinned)  # span of the next query
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
