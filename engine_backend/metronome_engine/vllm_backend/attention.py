"""Sinks + window attention over vLLM's paged KV cache, batched: no per-request host work.

Each query at stream index ``p`` sees its window (keys ``p-W+1 .. p``, scored with the query
rotated at ``p``: keys are cached rotated at their stream index) and the sinks that have left
that window (keys ``0 .. min(S, p-W+1) - 1``, scored with the query rotated at its in-cache
position, see ``positions.py``). The two parts are computed apart and merged by their
log-sum-exp, as vLLM's cascade attention merges a prefix and a suffix.

The cache is read through vLLM's logical per-layer view ``[blocks, kv_heads, block_size,
head_size + head_size_v]`` (K then V on the last axis), whatever its physical layout (NHD or
HND): every read indexes that view, so its strides decide where the bytes are.

This module is torch only: the window pass here (``WindowTiles``) is the one every device
can run; on CUDA the backend runs FlashAttention's sliding-window kernel instead and shares
``sink_pass`` and the merge.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["WindowTiles", "sink_pass", "token_requests", "window_pass", "write_kv"]

# queries per tile: a chunk of c tokens is scored in ceil(c / TILE) tiles, each over its own
# key span of W + TILE - 1 tokens, so a long prompt beside short chunks pads nothing but its last tile
TILE = 16


def token_requests(query_start_loc: Tensor, seq_lens: Tensor, num_tokens: int) -> tuple[Tensor, Tensor]:
    """Each token's request row and stream index, from the batch's metadata (device ops only).

    Tokens past the last request (CUDA-graph padding) map to the last row; their outputs are
    discarded by the caller.
    """
    t = torch.arange(num_tokens, device=query_start_loc.device, dtype=query_start_loc.dtype)
    req = torch.searchsorted(query_start_loc[1:].contiguous(), t, right=True)
    req = req.clamp_(max=seq_lens.shape[0] - 1)
    # a request's tokens end at its seq_len: the last sits at seq_len - 1
    pos = seq_lens[req].long() - query_start_loc[req + 1].long() + t.long()
    return req.long(), pos


def write_kv(kv_cache: Tensor, key: Tensor, value: Tensor, slot_mapping: Tensor) -> None:
    """Store this step's K/V at their slots; padding slots (``-1``) land in vLLM's null block 0."""
    n = slot_mapping.shape[0]
    head_size = key.shape[-1]
    slots = slot_mapping.long().clamp(min=0)
    block, offset = slots // kv_cache.shape[2], slots % kv_cache.shape[2]
    kv_cache[block, :, offset, :head_size] = key[:n].to(kv_cache.dtype)
    kv_cache[block, :, offset, head_size:] = value[:n].to(kv_cache.dtype)


def _gather_blocks(kv_cache: Tensor, blocks: Tensor) -> Tensor:
    """``[rows, nblk]`` block ids -> ``[rows, kv_heads, nblk * block_size, C]`` (a copy, any layout)."""
    rows, nblk = blocks.shape
    _, heads, block_size, content = kv_cache.shape
    h = torch.arange(heads, device=blocks.device)
    kv = kv_cache[blocks[:, None, :], h[None, :, None]]  # [rows, heads, nblk, bs, C]
    return kv.view(rows, heads, nblk * block_size, content)


def _attend(q: Tensor, keys: Tensor, values: Tensor, bias: Tensor | None, scale: float) -> tuple[Tensor, Tensor]:
    """``q [R, H, Q, d]`` over ``keys/values [R, H, L, d]``: output ``[R, H, Q, dv]`` and lse ``[R, H, Q]``.

    A row that sees no key gets output 0 and lse ``-inf``, which the merge weighs as nothing.
    """
    scores = torch.matmul(q, keys.transpose(-1, -2)).mul_(scale)
    if bias is not None:
        scores.add_(bias)
    lse = torch.logsumexp(scores, dim=-1)
    finite = torch.where(torch.isfinite(lse), lse, torch.zeros_like(lse))
    probs = torch.exp(scores.sub_(finite.unsqueeze(-1)))
    return torch.matmul(probs.to(values.dtype), values), lse


def sink_pass(
    q_sink: Tensor,
    kv_cache: Tensor,
    block_table: Tensor,
    token_req: Tensor,
    token_pos: Tensor,
    *,
    window: int,
    sinks: int,
    scale: float,
) -> tuple[Tensor, Tensor]:
    """Attention of each query (rotated at its in-cache position) over the sinks left out of its window.

    ``q_sink [T, H, d]``; returns output ``[T, H, dv]`` (``q_sink``'s dtype) and float32 lse ``[H, T]``
    (vLLM's merge layout).
    Reads only the first ``ceil(S / block_size)`` blocks of each request.
    """
    num_tokens, num_heads, head_size = q_sink.shape
    _, kv_heads, block_size, _ = kv_cache.shape
    group = num_heads // kv_heads
    sink_blocks = block_table[:, : -(-sinks // block_size)].long()
    kv = _gather_blocks(kv_cache, sink_blocks)[:, :, :sinks]  # [R, kvh, S, C]
    # a handful of keys per query: score in float32 whatever the cache holds (the merge wants a float32 lse)
    kv = kv[token_req].float()  # [T, kvh, S, C]
    keys, values = kv[..., :head_size], kv[..., head_size:]
    q = q_sink.float().reshape(num_tokens, kv_heads, group, head_size)
    # sink j is read here only once it has left the query's window: j < p - W + 1
    left = torch.arange(sinks, device=q.device)[None, :] < (token_pos - window + 1)[:, None]
    bias = torch.zeros(left.shape, dtype=q.dtype, device=q.device).masked_fill_(~left, float("-inf"))
    out, lse = _attend(q, keys, values, bias[:, None, None, :], scale)
    out = out.reshape(num_tokens, num_heads, -1).to(q_sink.dtype)
    return out, lse.reshape(num_tokens, num_heads).t().contiguous()


@dataclass(frozen=True, slots=True)
class WindowTiles:
    """Where each tile of queries reads its window: built once per step, shared by every layer.

    A tile is up to ``qt`` consecutive query tokens of one request; it reads ``nblk`` whole
    blocks starting at the block of its first query's window start, and a bias masks each
    query to its own window ``p-W+1 .. p``.
    """

    blocks: Tensor  # [R, nblk] cache block ids per tile
    query_rows: Tensor  # [R * qt] token index of each tile row (padding rows repeat the tile's first)
    bias: Tensor  # [R, qt, nblk * block_size] 0 where the row's query sees the column, else -inf
    token_rows: Tensor  # [T] tile row holding each token
    qt: int

    @classmethod
    def build(
        cls,
        query_start_loc: Tensor,
        seq_lens: Tensor,
        block_table: Tensor,
        *,
        num_tokens: int,
        max_query_len: int,
        max_seq_len: int,
        block_size: int,
        window: int,
        dtype: torch.dtype,
    ) -> WindowTiles:
        device = block_table.device
        qsl = query_start_loc.long()
        lens = seq_lens.long()
        qt = max(1, min(max_query_len, TILE))
        qlen = qsl[1:] - qsl[:-1]
        ntiles = (qlen + qt - 1) // qt
        first_tile = torch.cumsum(ntiles, 0) - ntiles
        num_req = lens.shape[0]
        tile_req = torch.repeat_interleave(torch.arange(num_req, device=device), ntiles)
        k = torch.arange(tile_req.shape[0], device=device) - first_tile[tile_req]
        start = qsl[tile_req] + k * qt
        end = qsl[tile_req + 1]
        rows = start[:, None] + torch.arange(qt, device=device)[None, :]
        rows = torch.where(rows < end[:, None], rows, start[:, None])
        qpos = (lens[tile_req] - end)[:, None] + rows  # [R, qt] stream index of each row
        first_block = torch.clamp(qpos[:, 0] - window + 1, min=0) // block_size
        # the span p0-W+1 .. p0+qt-1 covers at most this many blocks, and never more than the longest context
        nblk = min(math.ceil((window + qt - 1) / block_size) + 1, math.ceil(max_seq_len / block_size))
        nblk = max(nblk, 1)
        idx = (first_block[:, None] + torch.arange(nblk, device=device)[None, :]).clamp_(max=block_table.shape[1] - 1)
        blocks = block_table[tile_req[:, None], idx].long()
        kpos = first_block[:, None] * block_size + torch.arange(nblk * block_size, device=device)[None, :]
        q3, k3 = qpos[:, :, None], kpos[:, None, :]
        seen = (k3 <= q3) & (k3 > q3 - window)
        bias = torch.zeros(seen.shape, dtype=dtype, device=device).masked_fill_(~seen, float("-inf"))
        t = torch.arange(num_tokens, device=device)
        req = torch.searchsorted(qsl[1:].contiguous(), t, right=True).clamp_(max=num_req - 1)
        local = t - qsl[req]
        token_rows = (first_tile[req] + local // qt) * qt + local % qt
        return cls(blocks=blocks, query_rows=rows.reshape(-1), bias=bias, token_rows=token_rows, qt=qt)


def window_pass(query: Tensor, kv_cache: Tensor, tiles: WindowTiles, *, scale: float) -> tuple[Tensor, Tensor]:
    """Sliding-window attention at stream positions: output ``[T, H, dv]`` and lse ``[H, T]``."""
    num_heads, head_size = query.shape[1:]
    kv_heads = kv_cache.shape[1]
    group = num_heads // kv_heads
    rows, qt = tiles.blocks.shape[0], tiles.qt
    kv = _gather_blocks(kv_cache, tiles.blocks).to(query.dtype)  # [R, kvh, L, C]
    keys, values = kv[..., :head_size], kv[..., head_size:]
    q = query.index_select(0, tiles.query_rows).view(rows, qt, kv_heads, group, head_size)
    q = q.permute(0, 2, 1, 3, 4).reshape(rows, kv_heads, qt * group, head_size)
    length = tiles.bias.shape[-1]
    bias = (
        tiles.bias.view(rows, 1, qt, 1, length).expand(rows, 1, qt, group, length).reshape(rows, 1, qt * group, length)
    )
    out, lse = _attend(q, keys, values, bias, scale)
    out = out.view(rows, kv_heads, qt, group, -1).permute(0, 2, 1, 3, 4).reshape(rows * qt, num_heads, -1)
    lse = lse.view(rows, kv_heads, qt, group).permute(0, 2, 1, 3).reshape(rows * qt, num_heads)
    return out.index_select(0, tiles.token_rows), lse.index_select(0, tiles.token_rows).t().float().contiguous()
