"""A persistent, contiguous copy of the K/V that the current batch attends to.

Gathering every session's blocks out of the pool at every layer of every step copies
all resident K/V once more per step; on a CPU that copy costs as much as attention
itself. Between ticks a batch rarely changes: each session appends a token or a chunk,
and a windowed session drops one block every ``block_size`` tokens. So the view keeps
one row per session, ``[layers, kv_heads, rows, capacity * block_size, head_dim]``: new
tokens are written to the pool and to the view, a block that leaves the window becomes
a masked hole, and a row is copied again from the pool only when it runs out of room.
The pool stays the source of truth; the view is a cache of it for one batch.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from .kv_cache import KVCache
from .sequence import SequenceKV

__all__ = ["BatchView", "HOLE"]

HOLE = -1  # logical id of a view block whose tokens left the cache
_HEADROOM = 2  # spare blocks per row, so appends and holes fit without copying the row again


class BatchView:
    def __init__(self) -> None:
        self.key: tuple[int, ...] = ()
        self.capacity = 0  # blocks per row
        self.rows: list[list[tuple[int, int]]] = []  # (logical, physical) per view block
        self.k: Tensor = torch.empty(0)
        self.v: Tensor = torch.empty(0)
        self._k_store: Tensor = torch.empty(0)  # flat storage that k and v view, grown, never shrunk
        self._v_store: Tensor = torch.empty(0)

    def prepare(self, cache: KVCache, seqs: Sequence[SequenceKV]) -> list[list[int]]:
        """Bring the view up to date for a step; return each row's logical block ids.

        Call after the step's blocks are reserved and before the forward pass writes the
        new tokens (to the pool and to the view).
        """
        key = tuple(s.seq_id for s in seqs)
        tables = [s.resident_blocks() for s in seqs]
        need = max(len(t) for t in tables)
        if key != self.key:
            self._reset(cache, key, need + _HEADROOM)
        elif need > self.capacity:
            # grow by a quarter at least, so a long full-policy stream is re-copied O(log n) times
            self._reset(cache, key, max(need + _HEADROOM, self.capacity * 5 // 4))
        for b, table in enumerate(tables):
            self._update_row(cache, b, table)
        return [[lb for lb, _ in row] for row in self.rows]

    def invalidate(self) -> None:
        """Forget every row (the pool changed under the view): the next step copies them again."""
        self.key = ()

    def _reset(self, cache: KVCache, key: tuple[int, ...], capacity: int) -> None:
        layers, kvh, _, hd = cache.k.shape
        shape = (layers, kvh, len(key), capacity * cache.block_size, hd)
        size = layers * kvh * len(key) * capacity * cache.block_size * hd
        if self._k_store.numel() < size:
            # zeros, not garbage: masked columns still enter the matmuls, and 0 * NaN is NaN
            self._k_store = cache.k.new_zeros(size)
            self._v_store = cache.v.new_zeros(size)
        # a smaller or equal shape reuses the storage, whose stale columns hold zeros or K/V
        # of earlier rows (finite: a step with non-finite K/V gets a new view): allocating
        # and zeroing megabytes each time a batch changes cost more than copying its rows
        self.k = self._k_store[:size].view(shape)
        self.v = self._v_store[:size].view(shape)
        self.key, self.capacity = key, capacity
        self.rows = [[] for _ in key]

    def _update_row(self, cache: KVCache, b: int, table: list[tuple[int, int]]) -> None:
        row = self.rows[b]
        wanted = dict(table)
        if any(lb != HOLE and lb in wanted and wanted[lb] != pb for lb, pb in row):
            row.clear()  # a block was replaced under the same logical id: start the row again
        row[:] = [(lb, pb) if lb != HOLE and lb in wanted else (HOLE, -1) for lb, pb in row]
        last = max((lb for lb, _ in row if lb != HOLE), default=-1)
        held = {lb for lb, _ in row}
        fresh = [(lb, pb) for lb, pb in table if lb not in held]
        if len(row) + len(fresh) > self.capacity or any(lb < last for lb, _ in fresh):
            row[:] = table  # out of room (or out of order): copy the whole row again
            self._copy(cache, b, 0, [pb for _, pb in table])
            return
        start = len(row)
        row.extend(fresh)
        self._copy(cache, b, start, [pb for _, pb in fresh])

    def _copy(self, cache: KVCache, b: int, start: int, blocks: list[int]) -> None:
        if not blocks:
            return
        layers, kvh, slots, hd = cache.k.shape
        run = cache.block_size * hd
        idx = torch.tensor(blocks, dtype=torch.int64, device=cache.k.device)
        for src, dst in ((cache.k, self.k), (cache.v, self.v)):
            pool_blocks = src.view(layers, kvh, slots // cache.block_size, run)
            rows = dst.view(layers, kvh, len(self.rows), self.capacity, run)
            rows[:, :, b, start : start + len(blocks)] = pool_blocks.index_select(2, idx)

    def layer(self, i: int) -> tuple[Tensor, Tensor]:
        """K and V of layer ``i`` as ``[kv_heads, rows * capacity * block_size, head_dim]``."""
        kvh, hd = self.k.shape[1], self.k.shape[-1]
        return self.k[i].view(kvh, -1, hd), self.v[i].view(kvh, -1, hd)
