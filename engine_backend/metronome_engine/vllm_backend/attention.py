"""Sinks + window attention over vLLM's paged KV cache, batched: no per-request host work.

Each query at stream index ``p`` sees its window (keys ``p-W+1 .. p``, scored with the query
rotated at ``p``: keys are cached rotated at their stream index) and the sinks that have left
that window (keys ``0 .. min(S, p-W+1) - 1``, scored as by the query rotated at its in-cache
position ``c``, see ``positions.py``).

- ``sink_window_attention`` (the torch backend, any device): one fused pass. RoPE scores
  depend on the difference of the two angles, so a sink key rotated on by ``p - c`` scores
  against the query at ``p`` exactly as the cached sink against the query at ``c``: each
  query row gets its own relocated copy of the sinks beside its window, and one masked
  softmax (torch's fused attention kernel) covers both.
- ``sink_pass`` (the CUDA backend, beside FlashAttention's sliding-window kernel): the sinks
  scored with the query at ``c`` in a pass of their own, merged with the window part by
  their log-sum-exp, as vLLM's cascade attention merges a prefix and a suffix.

The cache is read through vLLM's logical per-layer view ``[blocks, kv_heads, block_size,
head_size + head_size_v]`` (K then V on the last axis), whatever its physical layout (NHD or
HND): every read indexes that view, so its strides decide where the bytes are.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from .positions import in_cache_positions

__all__ = [
    "Rotate",
    "SinkIndex",
    "WindowTiles",
    "count_tiles",
    "sink_pass",
    "sink_window_attention",
    "tile_rows",
    "token_requests",
    "write_kv",
]

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
    by_slot = kv_cache.transpose(1, 2)  # [blocks, block_size, kv_heads, C]
    if by_slot.is_contiguous():  # NHD: a slot's heads and K|V are one run, one copy writes them all
        rows = torch.cat((key[:n], value[:n]), dim=-1).to(kv_cache.dtype)
        by_slot.view(-1, *by_slot.shape[2:]).index_copy_(0, slots, rows)
        return
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


@dataclass(frozen=True, slots=True)
class _Tiles:
    """Tiles of up to ``qt`` consecutive query tokens of one request (padding rows repeat a tile's first)."""

    req: Tensor  # [R] request of each tile
    rows: Tensor  # [R, qt] token index of each tile row
    qpos: Tensor  # [R, qt] stream index of each row
    token_tile: Tensor  # [T] tile holding each token
    token_slot: Tensor  # [T] its row in the tile


def _tile(query_start_loc: Tensor, seq_lens: Tensor, *, num_tokens: int, qt: int, num_tiles: int | None) -> _Tiles:
    """The step's tiles; ``num_tiles`` (from the host copy of the query offsets) spares a device sync."""
    device = seq_lens.device
    qsl = query_start_loc.long()
    lens = seq_lens.long()
    qlen = qsl[1:] - qsl[:-1]
    ntiles = (qlen + qt - 1) // qt
    first_tile = torch.cumsum(ntiles, 0) - ntiles
    num_req = lens.shape[0]
    tile_req = torch.repeat_interleave(torch.arange(num_req, device=device), ntiles, output_size=num_tiles)
    k = torch.arange(tile_req.shape[0], device=device) - first_tile[tile_req]
    start = qsl[tile_req] + k * qt
    end = qsl[tile_req + 1]
    rows = start[:, None] + torch.arange(qt, device=device)[None, :]
    rows = torch.where(rows < end[:, None], rows, start[:, None])
    qpos = (lens[tile_req] - end)[:, None] + rows
    t = torch.arange(num_tokens, device=device)
    req = torch.searchsorted(qsl[1:].contiguous(), t, right=True).clamp_(max=num_req - 1)
    local = t - qsl[req]
    return _Tiles(tile_req, rows, qpos, first_tile[req] + local // qt, local % qt)


def tile_rows(max_query_len: int) -> int:
    """Rows per tile in a step whose longest chunk is ``max_query_len`` tokens."""
    return max(1, min(max_query_len, TILE))


def count_tiles(query_start_loc_cpu: Tensor, max_query_len: int) -> int:
    """How many tiles the step's requests fill, from the host copy of their query offsets."""
    qt = tile_rows(max_query_len)
    qlen = query_start_loc_cpu[1:] - query_start_loc_cpu[:-1]
    return int(((qlen + qt - 1) // qt).sum())


@dataclass(frozen=True, slots=True)
class SinkIndex:
    """Where the sink pass reads and writes: built once per step by the metadata builder, read by every layer.

    The step's queries are grouped in tiles of up to ``qt`` consecutive tokens of one request
    (a decode or a frame of a few tokens is one tile), so each tile reads its request's sinks
    once, not once per token. ``bias`` lets row ``t`` see sink ``j`` once the sink has left its
    window: ``j < p - W + 1``.
    """

    blocks: Tensor  # [R, ceil(S / block_size)] cache blocks holding each tile's sinks
    query_rows: Tensor  # [R, qt] token index of each tile row (padding rows repeat the tile's first)
    bias: Tensor  # [R, 1, qt, S] float32: 0 where the row sees the sink, else -inf
    token_tile: Tensor  # [T] tile holding each token
    token_slot: Tensor  # [T] its row in the tile
    sinks: int

    @classmethod
    def build(
        cls,
        query_start_loc: Tensor,
        seq_lens: Tensor,
        block_table: Tensor,
        *,
        num_tokens: int,
        max_query_len: int,
        block_size: int,
        window: int,
        sinks: int,
        num_tiles: int | None = None,
    ) -> SinkIndex:
        if sinks < 1:
            raise ValueError(f"a sink index needs sinks >= 1, got {sinks}")
        qt = tile_rows(max_query_len)
        tiles = _tile(query_start_loc, seq_lens, num_tokens=num_tokens, qt=qt, num_tiles=num_tiles)
        device = block_table.device
        blocks = block_table[:, : -(-sinks // block_size)][tiles.req].long()
        left = torch.arange(sinks, device=device)[None, None, :] < (tiles.qpos - window + 1)[:, :, None]
        bias = torch.zeros(left.shape, dtype=torch.float32, device=device).masked_fill_(~left, float("-inf"))
        return cls(blocks, tiles.rows, bias[:, None], tiles.token_tile, tiles.token_slot, sinks)


def sink_pass(q_sink: Tensor, kv_cache: Tensor, index: SinkIndex, *, scale: float) -> tuple[Tensor, Tensor]:
    """Attention of each query (rotated at its in-cache position) over the sinks left out of its window.

    ``q_sink [T, H, d]``; returns output ``[T, H, dv]`` (``q_sink``'s dtype) and float32 lse ``[H, T]``
    (vLLM's merge layout). Reads only the first ``ceil(S / block_size)`` blocks of each tile's request.
    """
    num_tokens, num_heads, head_size = q_sink.shape
    kv_heads = kv_cache.shape[1]
    group = num_heads // kv_heads
    rows, qt = index.query_rows.shape
    # a handful of keys per tile: score in float32 whatever the cache holds (the merge wants a float32 lse)
    kv = _gather_blocks(kv_cache, index.blocks)[:, :, : index.sinks].float()  # [R, kvh, S, C]
    keys, values = kv[..., :head_size], kv[..., head_size:]
    # query head h reads kv head h // group: [R, qt, kvh, g, d] -> [R, kvh, qt * g, d]
    q = q_sink[index.query_rows].float().view(rows, qt, kv_heads, group, head_size)
    q = q.permute(0, 2, 1, 3, 4).reshape(rows, kv_heads, qt * group, head_size)
    bias = index.bias[:, :, :, None, :].expand(-1, -1, -1, group, -1).reshape(rows, 1, qt * group, index.sinks)
    out, lse = _attend(q, keys, values, bias, scale)
    out = out.view(rows, kv_heads, qt, group, -1).permute(0, 2, 1, 3, 4)[index.token_tile, index.token_slot]
    lse = lse.view(rows, kv_heads, qt, group).permute(0, 2, 1, 3)[index.token_tile, index.token_slot]
    return out.reshape(num_tokens, num_heads, -1).to(q_sink.dtype), lse.reshape(num_tokens, num_heads).t().contiguous()


@dataclass(frozen=True, slots=True)
class WindowTiles:
    """Where each tile of queries reads its keys: built once per step, shared by every layer.

    A tile is up to ``qt`` consecutive query tokens of one request. Its key columns are
    ``nr`` block-sized slots for its sinks, then ``nblk`` whole blocks starting at the block
    of its first query's window start. The sink slots first receive the request's first
    blocks (where the sinks are), then are overwritten by the sinks *relocated* for each
    query row: sink ``j`` rotated on by ``delta = p - c`` (stream index minus in-cache
    position), so that the query rotated at its stream index scores it as the query at its
    in-cache position would (RoPE: the score depends on the difference of the two angles).
    Row ``t``'s sinks sit at columns ``t*S .. t*S+S-1``. A mask lets each query see its own
    sinks that have left its window, and its window ``p-W+1 .. p``.
    """

    blocks: Tensor  # [R, nr + nblk] cache block ids per tile: its first blocks (the sinks), then its window span
    query_rows: Tensor  # [R, qt] token index of each tile row (padding rows repeat the tile's first)
    delta: Tensor  # [R * qt * S] how far each row's sinks are rotated on (row-major, each row's S sinks)
    mask: Tensor  # [R, 1, qt, (nr + nblk) * block_size] 0 where the row sees the column, else -inf
    token_tile: Tensor  # [T] tile holding each token
    token_slot: Tensor  # [T] its row in the tile
    qt: int
    sinks: int

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
        sinks: int,
        dtype: torch.dtype,
    ) -> WindowTiles:
        device = block_table.device
        qt = tile_rows(max_query_len)
        tiles = _tile(query_start_loc, seq_lens, num_tokens=num_tokens, qt=qt, num_tiles=None)
        tile_req, rows, qpos = tiles.req, tiles.rows, tiles.qpos
        first_block = torch.clamp(qpos[:, 0] - window + 1, min=0) // block_size
        # the span p0-W+1 .. p0+qt-1 covers at most this many blocks, and never more than the longest context
        nblk = min(math.ceil((window + qt - 1) / block_size) + 1, math.ceil(max_seq_len / block_size))
        nblk = max(nblk, 1)
        idx = (first_block[:, None] + torch.arange(nblk, device=device)[None, :]).clamp_(max=block_table.shape[1] - 1)
        q3 = qpos[:, :, None]
        kpos = first_block[:, None] * block_size + torch.arange(nblk * block_size, device=device)[None, :]
        seen = (kpos[:, None, :] <= q3) & (kpos[:, None, :] > q3 - window)
        delta = torch.zeros(0, dtype=torch.long, device=device)
        if sinks:
            nr = -(-qt * sinks // block_size)  # room for every row's relocated sinks
            first = torch.arange(nr, device=device).clamp_(max=max(0, -(-sinks // block_size) - 1))
            idx = torch.cat((first.expand(idx.shape[0], nr), idx), dim=1)
            col = torch.arange(nr * block_size, device=device)
            row_of, j = col // sinks, col % sinks
            # row t sees its sink j (column t*S + j) once the sink has left its window: j < p - W + 1
            mine = row_of[None, None, :] == torch.arange(qt, device=device)[None, :, None]
            seen = torch.cat((mine & (j[None, None, :] < q3 - window + 1), seen), dim=2)
            at = in_cache_positions(qpos, window=window, sinks=sinks)
            delta = (qpos - at)[:, :, None].expand(-1, -1, sinks).reshape(-1)
        blocks = block_table[tile_req[:, None], idx].long()
        mask = torch.zeros(seen.shape, dtype=dtype, device=device).masked_fill_(~seen, float("-inf"))
        return cls(
            blocks=blocks,
            query_rows=rows,
            delta=delta,
            mask=mask[:, None],
            token_tile=tiles.token_tile,
            token_slot=tiles.token_slot,
            qt=qt,
            sinks=sinks,
        )


# ``rotate(positions [N], x [N, heads, d]) -> x`` rotated on by ``positions`` (the model's RoPE)
Rotate = Callable[[Tensor, Tensor], Tensor]


def sink_window_attention(
    query: Tensor,
    kv_cache: Tensor,
    tiles: WindowTiles,
    *,
    scale: float,
    rotate: Rotate | None,
    return_lse: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Sinks + window attention in one fused softmax: output ``[T, H, dv]`` (and lse ``[H, T]`` if asked).

    ``query`` is rotated at its stream index. One gather of the tiles' blocks, the sinks
    relocated per query row in place (``rotate``: the model's RoPE; ``None`` when the tiles
    hold no sinks), then torch's fused attention kernel over the masked columns (grouped
    query heads read their KV head in place). Every row sees its own key, so none is empty.
    """
    head_size = query.shape[-1]
    kv_heads = kv_cache.shape[1]
    rows, qt, sinks = tiles.blocks.shape[0], tiles.qt, tiles.sinks
    kv = _gather_blocks(kv_cache, tiles.blocks).to(query.dtype)  # [R, kvh, L, C]
    if sinks:
        if rotate is None:
            raise ValueError("these tiles relocate sinks: pass the model's rotation")
        # every row's copy of the sinks ([R, qt, S, kvh, C]), keys rotated on by the row's delta
        copies = kv[:, :, None, :sinks].expand(rows, kv_heads, qt, sinks, -1).permute(0, 2, 3, 1, 4).contiguous()
        flat = copies.view(rows * qt * sinks, kv_heads, -1)
        flat[..., :head_size] = rotate(tiles.delta, flat[..., :head_size].contiguous())
        kv[:, :, : qt * sinks] = copies.view(rows, qt * sinks, kv_heads, -1).transpose(1, 2)
    keys, values = kv[..., :head_size], kv[..., head_size:]
    q = query[tiles.query_rows].transpose(1, 2)  # [R, H, qt, d]
    if return_lse:
        out, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
            q, keys, values, 0.0, False, attn_mask=tiles.mask, scale=scale
        )[:2]
    else:
        out = F.scaled_dot_product_attention(q, keys, values, attn_mask=tiles.mask, scale=scale, enable_gqa=True)
    out = out.transpose(1, 2)[tiles.token_tile, tiles.token_slot]  # [T, H, dv]
    if return_lse:
        lse = lse.transpose(1, 2)[tiles.token_tile, tiles.token_slot].t().float().contiguous()
        return out, lse
    return out, None
