"""Attention over the paged pool for one batched step.

Each session contributes ``c`` new query tokens at stream indices ``t0..t1`` and is
given a row of key columns: ``S`` sink columns (stream ``0..S-1``) then its window
columns (stream ``ws0..t1``, where ``ws0`` is the window start of its first query).
A per-query mask then selects exactly that query's span, so a chunk of ``c`` tokens
scores each token as if the tokens had been fed one by one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from .kv_policy import KVPolicy
from .sequence import SequenceKV

__all__ = ["AttentionBatch", "SeqChunk"]

_PAD = 1 << 62  # stream index of a padding column: never inside any span


@dataclass(frozen=True, slots=True)
class SeqChunk:
    """One session's share of a step: ``n_new`` tokens appended after ``seq.num_tokens``."""

    seq: SequenceKV
    n_new: int
    all_logits: bool = False  # score every new token (evaluation), not only the last


@dataclass(slots=True)
class AttentionBatch:
    positions: Tensor  # [T] stream index of each new token
    sink_positions: Tensor | None  # [T] in-cache position of each new token (bounded policy with sinks)
    slot_mapping: Tensor  # [T] pool slot each new token's K/V is written to
    q_index: Tensor | None  # [T] row in the padded [B * Cmax] query layout; None when T == B * Cmax
    gather: Tensor  # [B * max_blocks] pool block behind each run of block_size key columns
    mask: Tensor  # [B, Cmax, Lmax] additive mask, 0 or -inf
    logit_rows: Tensor | None  # rows of [T] whose logits are wanted; None for all
    num_seqs: int
    max_chunk: int
    max_cols: int
    sink_cols: int
    group_size: int
    scale: float
    block_row: int  # floats in one block of one head: block_size * head_dim
    _head_gather: Tensor | None = None
    _head_gather_blocks: int = 0
    _buffers: dict[str, Tensor] = field(default_factory=dict)

    @classmethod
    def build(
        cls, policy: KVPolicy, chunks: Sequence[SeqChunk], *, head_dim: int, group_size: int, device: torch.device
    ) -> AttentionBatch:
        sinks = policy.sinks if policy.bounded else 0
        window = policy.window
        bs = chunks[0].seq.block_size
        positions: list[int] = []
        slot_mapping: list[int] = []
        q_index: list[int] = []
        logit_rows: list[int] = []
        tables: list[list[tuple[int, int]]] = []  # resident (logical, physical) blocks per session
        any_all = False
        max_chunk = max(ch.n_new for ch in chunks)
        for b, ch in enumerate(chunks):
            seq, t0 = ch.seq, ch.seq.num_tokens
            t1 = t0 + ch.n_new - 1
            base = len(positions)
            positions.extend(range(t0, t1 + 1))
            slot_mapping.extend(seq.slots(t0, t1 + 1))
            q_index.extend(range(b * max_chunk, b * max_chunk + ch.n_new))
            if ch.all_logits:
                any_all = True
                logit_rows.extend(range(base, base + ch.n_new))
            else:
                logit_rows.append(base + ch.n_new - 1)
            tables.append(seq.resident_blocks())
        num_seqs = len(chunks)
        max_blocks = max(len(t) for t in tables)
        max_cols = max_blocks * bs
        # whole blocks are gathered (a contiguous copy per block); the mask drops the
        # tokens of a block that are outside a query's span. Sink blocks come first, so
        # column c < S is stream token c in every session.
        block_ids = torch.zeros(num_seqs, max_blocks, dtype=torch.int64)
        kpos = torch.full((num_seqs, max_blocks, bs), _PAD, dtype=torch.int64)
        offsets = torch.arange(bs, dtype=torch.int64)
        for b, table in enumerate(tables):
            logical = torch.tensor([lb for lb, _ in table], dtype=torch.int64)
            block_ids[b, : len(table)] = torch.tensor([pb for _, pb in table], dtype=torch.int64)
            kpos[b, : len(table)] = logical[:, None] * bs + offsets
        kpos = kpos.view(num_seqs, max_cols)
        pos = torch.tensor(positions, dtype=torch.int64)
        qidx = torch.tensor(q_index, dtype=torch.int64)
        # padded query rows repeat their session's last token, so no row is empty
        qpos = torch.empty(num_seqs * max_chunk, dtype=torch.int64)
        for b, ch in enumerate(chunks):
            qpos[b * max_chunk : (b + 1) * max_chunk] = ch.seq.num_tokens + ch.n_new - 1
        qpos[qidx] = pos
        qpos = qpos.view(num_seqs, max_chunk, 1)
        k = kpos.view(num_seqs, 1, max_cols)
        valid: Tensor
        if window is None:
            valid = k <= qpos
            sink_positions = None
        else:
            lo = torch.clamp(qpos - window + 1, min=sinks)
            is_sink_col = torch.arange(max_cols).view(1, 1, max_cols) < sinks
            valid = torch.where(is_sink_col, k <= qpos, (k >= lo) & (k <= qpos))
            if sinks:
                # in-cache position of query t: (sinks it sees) + (window tokens it sees) - 1
                n_sink_t = torch.clamp(pos + 1, max=sinks)
                lo_t = torch.clamp(pos - window + 1, min=sinks)
                sink_positions = n_sink_t + torch.clamp(pos - lo_t + 1, min=0) - 1
            else:
                sink_positions = None
        mask = torch.zeros(valid.shape, dtype=torch.float32).masked_fill_(~valid, float("-inf"))
        dense = len(positions) == num_seqs * max_chunk
        return cls(
            positions=pos.to(device),
            sink_positions=sink_positions.to(device) if sink_positions is not None else None,
            slot_mapping=torch.tensor(slot_mapping, dtype=torch.int64, device=device),
            q_index=None if dense else qidx.to(device),
            gather=block_ids.view(-1).to(device),
            mask=mask.to(device),
            logit_rows=torch.tensor(logit_rows, dtype=torch.int64, device=device)
            if not (any_all and len(logit_rows) == len(positions))
            else None,
            num_seqs=num_seqs,
            max_chunk=max_chunk,
            max_cols=max_cols,
            sink_cols=sinks,
            group_size=group_size,
            scale=1.0 / math.sqrt(head_dim),
            block_row=bs * head_dim,
        )

    def _to_heads(self, q: Tensor) -> Tensor:
        """``[T, H, hd]`` -> ``[kvh, B, Cmax * g, hd]`` (padded)."""
        n_rows = self.num_seqs * self.max_chunk
        if self.q_index is not None:
            padded = q.new_zeros((n_rows, *q.shape[1:]))
            padded.index_copy_(0, self.q_index, q)
            q = padded
        kvh = q.shape[1] // self.group_size
        q = q.view(self.num_seqs, self.max_chunk, kvh, self.group_size, q.shape[-1])
        return q.permute(2, 0, 1, 3, 4).reshape(kvh, self.num_seqs, self.max_chunk * self.group_size, -1)

    def _gather(self, layer: Tensor, which: str) -> Tensor:
        # rows of whole blocks: index_select on dim 0 of contiguous rows runs at copy speed
        kvh, slots, hd = layer.shape
        num_blocks = slots * hd // self.block_row
        if self._head_gather is None or self._head_gather_blocks != num_blocks:
            heads = torch.arange(kvh, device=self.gather.device).view(kvh, 1) * num_blocks
            self._head_gather = (heads + self.gather.view(1, -1)).view(-1)
            self._head_gather_blocks = num_blocks
        rows = layer.view(kvh * num_blocks, self.block_row)
        # one buffer per step for K and one for V, reused by every layer: fresh multi-MB
        # allocations each layer cost page faults that dwarf the copy itself
        buf = self._buffers.get(which)
        if buf is None:
            buf = rows.new_empty((self._head_gather.numel(), self.block_row))
            self._buffers[which] = buf
        return torch.index_select(rows, 0, self._head_gather, out=buf)

    def attend(self, q: Tensor, q_sink: Tensor | None, k_layer: Tensor, v_layer: Tensor) -> Tensor:
        """Attention output ``[T, H * hd]`` for this step's queries against ``[kvh, slots, hd]`` K/V."""
        kvh, _, hd = k_layer.shape
        b, c, g, cols = self.num_seqs, self.max_chunk, self.group_size, self.max_cols
        keys = self._gather(k_layer, "k").view(kvh, b, cols, hd)
        values = self._gather(v_layer, "v").view(kvh, b, cols, hd)
        scores = torch.matmul(self._to_heads(q), keys.transpose(-1, -2))
        if q_sink is not None and self.sink_cols:
            s = self.sink_cols
            scores[..., :s] = torch.matmul(self._to_heads(q_sink), keys[:, :, :s].transpose(-1, -2))
        scores.mul_(self.scale)
        scores.view(kvh, b, c, g, cols).add_(self.mask.view(1, b, c, 1, cols))
        probs = torch.softmax(scores, dim=-1)
        out = torch.matmul(probs, values)  # [kvh, B, C*g, hd]
        out = out.view(kvh, b, c, g, hd).permute(1, 2, 0, 3, 4).reshape(b * c, kvh * g * hd)
        if self.q_index is not None:
            out = out.index_select(0, self.q_index)
        return out
