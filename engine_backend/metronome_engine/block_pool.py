"""A fixed pool of KV blocks. Pure Python: no torch, so it is testable on its own.

"No room" is a return value (``None``), never an exception: the engine decides
what a full pool means for each session (a stall it reports, not silence).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

__all__ = ["BlockPool"]


class BlockPool:
    """``num_blocks`` blocks of ``block_size`` token slots each.

    Block ids are ``0..num_blocks-1``; slot ``s`` of block ``b`` is the global
    slot ``b * block_size + s`` in the engine's KV tensors.
    """

    __slots__ = ("_block_size", "_free", "_num_blocks", "_used")

    def __init__(self, num_blocks: int, block_size: int = 16) -> None:
        if isinstance(num_blocks, bool) or not isinstance(num_blocks, int) or num_blocks < 1:
            raise ValueError(f"num_blocks must be an int >= 1, got {num_blocks!r}; give the pool at least one block")
        if isinstance(block_size, bool) or not isinstance(block_size, int) or block_size < 1:
            raise ValueError(f"block_size must be an int >= 1, got {block_size!r}; 16 is a good default")
        self._block_size = block_size
        self._num_blocks = num_blocks
        self._free: deque[int] = deque(range(num_blocks))
        self._used: set[int] = set()

    @classmethod
    def from_budget(cls, budget_bytes: int, *, bytes_per_block: int, block_size: int = 16) -> BlockPool:
        """Size a pool from a memory budget: as many whole blocks as fit."""
        if bytes_per_block < 1:
            raise ValueError(f"bytes_per_block must be >= 1, got {bytes_per_block!r}")
        num_blocks = budget_bytes // bytes_per_block
        if num_blocks < 1:
            raise ValueError(
                f"budget_bytes={budget_bytes} holds no block of {bytes_per_block} bytes; "
                f"raise the budget to at least {bytes_per_block}"
            )
        return cls(int(num_blocks), block_size)

    @property
    def block_size(self) -> int:
        return self._block_size

    @property
    def num_blocks(self) -> int:
        return self._num_blocks

    @property
    def num_free(self) -> int:
        return len(self._free)

    @property
    def num_used(self) -> int:
        return len(self._used)

    @property
    def occupancy(self) -> float:
        """Fraction of blocks in use, in ``[0, 1]``."""
        return len(self._used) / self._num_blocks

    def allocate(self, n: int) -> list[int] | None:
        """Take ``n`` blocks, or return ``None`` (taking nothing) if fewer are free."""
        if n < 0:
            raise ValueError(f"cannot allocate a negative number of blocks ({n})")
        if n > len(self._free):
            return None
        blocks = [self._free.popleft() for _ in range(n)]
        self._used.update(blocks)
        return blocks

    def free(self, blocks: Iterable[int]) -> None:
        """Return blocks to the pool. Freeing a block that is not in use is a bug."""
        blocks = list(blocks)
        if len(set(blocks)) != len(blocks):
            raise ValueError(f"blocks {blocks} name a block twice (double free)")
        for b in blocks:
            if b not in self._used:
                raise ValueError(f"block {b} is not allocated (double free or foreign block)")
        for b in blocks:
            self._used.discard(b)
            self._free.append(b)

    def __repr__(self) -> str:
        return (
            f"BlockPool(num_blocks={self._num_blocks}, block_size={self._block_size}, "
            f"used={self.num_used}, occupancy={self.occupancy:.2f})"
        )
