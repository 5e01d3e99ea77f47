"""Attention for one batched step, over the batch's view of the paged pool.

Each session contributes ``c`` new query tokens at stream indices ``t0..t1`` and owns
one row of the batch view (see ``batch_view.py``): whole blocks in stream order, pinned
blocks first, so column ``c < P`` holds stream token ``c`` in a row whose session pins
``P`` tokens (its sinks, or its longer pinned prefix; ``P`` differs between rows). A
per-query mask selects exactly that query's span (its pinned tokens, and the window
ending at itself), so a chunk of ``c`` tokens scores each token as if the tokens had
come one by one.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from .batch_view import HOLE
from .kv_policy import KVPolicy
from .sequence import SequenceKV

__all__ = ["AttentionBatch", "SeqChunk", "StepTokens"]

_PAD = 1 << 62  # stream index of a column outside every span (a hole, or past a row's end)


@dataclass(frozen=True, slots=True)
class SeqChunk:
    """One session's share of a step: ``n_new`` tokens appended after ``seq.num_tokens``."""

    seq: SequenceKV
    n_new: int
    all_logits: bool = False  # score every new token (evaluation), not only the last


@dataclass(frozen=True, slots=True)
class StepTokens:
    """Where each of a step's new tokens sits: what both attention paths need of it."""

    positions: Tensor  # [T] stream index of each new token
    sink_positions: Tensor | None  # [T] in-cache position of each new token (bounded policy, pinned tokens)
    slot_mapping: Tensor  # [T] pool slot each new token's K/V is written to
    logit_rows: Tensor | None  # rows of [T] whose logits are wanted; None for all

    @classmethod
    def build(cls, policy: KVPolicy, chunks: Sequence[SeqChunk], *, device: torch.device) -> StepTokens:
        positions: list[int] = []
        pinned: list[int] = []
        slot_mapping: list[int] = []
        logit_rows: list[int] = []
        for ch in chunks:
            t0, base = ch.seq.num_tokens, len(positions)
            positions.extend(range(t0, t0 + ch.n_new))
            pinned.extend([ch.seq.pinned] * ch.n_new)
            slot_mapping.extend(ch.seq.slots(t0, t0 + ch.n_new))
            if ch.all_logits:
                logit_rows.extend(range(base, base + ch.n_new))
            else:
                logit_rows.append(base + ch.n_new - 1)
        sink_positions: Tensor | None = None
        if policy.window is not None and any(pinned):
            # in-cache position of query t: (pinned tokens it sees) + (window tokens it sees) - 1;
            # on Python ints: four torch ops on a step's few rows cost about 25 us, this 5 us
            w = policy.window
            in_cache = [
                min(t + 1, p) + max(t - max(t - w + 1, p) + 1, 0) - 1 for t, p in zip(positions, pinned, strict=True)
            ]
            sink_positions = torch.tensor(in_cache, dtype=torch.int64, device=device)
        all_rows = len(logit_rows) == len(positions)
        return cls(
            positions=torch.tensor(positions, dtype=torch.int64, device=device),
            sink_positions=sink_positions,
            slot_mapping=torch.tensor(slot_mapping, dtype=torch.int64, device=device),
            logit_rows=None if all_rows else torch.tensor(logit_rows, dtype=torch.int64, device=device),
        )


@dataclass(frozen=True, slots=True)
class AttentionBatch:
    tokens: StepTokens
    view_mapping: Tensor  # [T] column of the batch view each new token's K/V is written to
    q_index: Tensor | None  # [T] row in the padded [B * Cmax] query layout; None when T == B * Cmax
    mask: Tensor  # [B, Cmax, cols] additive mask, 0 or -inf
    num_seqs: int
    max_chunk: int
    max_cols: int  # columns attention reads per row: up to the last block any row uses
    row_cols: int  # columns per row of the batch view (its capacity)
    sink_cols: int  # the most pinned tokens of any row: columns scored with the query at its in-cache position
    sink_rows: Tensor | None  # [1, B, 1, sink_cols] which of those columns each row pins; None: every row all
    group_size: int
    scale: float

    @classmethod
    def build(
        cls,
        policy: KVPolicy,
        chunks: Sequence[SeqChunk],
        view_rows: Sequence[Sequence[int]],
        capacity: int,
        *,
        head_dim: int,
        group_size: int,
        device: torch.device,
    ) -> AttentionBatch:
        window = policy.window
        row_pinned = [ch.seq.pinned for ch in chunks]  # 0 under the full policy
        bs = chunks[0].seq.block_size
        num_seqs = len(chunks)
        max_chunk = max(ch.n_new for ch in chunks)
        # a row's spare blocks past every row's last block hold nothing: attention stops before them
        used = max(len(row) for row in view_rows)
        max_cols = used * bs
        sinks = min(max(row_pinned), max_cols)  # a prefix still being prefilled has fewer columns yet
        tokens = StepTokens.build(policy, chunks, device=device)
        view_mapping: list[int] = []
        q_index: list[int] = []
        kpos = torch.full((num_seqs, used, bs), _PAD, dtype=torch.int64)
        offsets = torch.arange(bs, dtype=torch.int64)
        for b, (ch, row) in enumerate(zip(chunks, view_rows, strict=True)):
            t0 = ch.seq.num_tokens
            t1 = t0 + ch.n_new - 1
            where = {lb: vb for vb, lb in enumerate(row) if lb != HOLE}
            view_mapping.extend((b * capacity + where[j // bs]) * bs + j % bs for j in range(t0, t1 + 1))
            q_index.extend(range(b * max_chunk, b * max_chunk + ch.n_new))
            logical = torch.tensor(row, dtype=torch.int64)
            kpos[b, : len(row)] = torch.where(logical[:, None] == HOLE, _PAD, logical[:, None] * bs + offsets)
        kpos = kpos.view(num_seqs, max_cols)
        pos = tokens.positions.cpu()
        qidx = torch.tensor(q_index, dtype=torch.int64)
        # padded query rows repeat their session's last token, so no row of the mask is empty
        qpos = torch.empty(num_seqs * max_chunk, dtype=torch.int64)
        for b, ch in enumerate(chunks):
            qpos[b * max_chunk : (b + 1) * max_chunk] = ch.seq.num_tokens + ch.n_new - 1
        qpos[qidx] = pos
        qpos = qpos.view(num_seqs, max_chunk, 1)
        k = kpos.view(num_seqs, 1, max_cols)
        valid: Tensor
        if window is None:
            valid = k <= qpos
        else:
            p = torch.tensor(row_pinned, dtype=torch.int64).view(num_seqs, 1, 1)
            lo = torch.maximum(qpos - window + 1, p)
            valid = (k <= qpos) & ((k < p) | (k >= lo))
        mask = torch.zeros(valid.shape, dtype=torch.float32).masked_fill_(~valid, float("-inf"))
        sink_rows: Tensor | None = None
        if min(row_pinned) < sinks:  # rows pin different counts
            cols = torch.arange(sinks, dtype=torch.int64).view(1, 1, 1, sinks)
            sink_rows = (cols < torch.tensor(row_pinned, dtype=torch.int64).view(1, num_seqs, 1, 1)).to(device)
        return cls(
            tokens=tokens,
            view_mapping=torch.tensor(view_mapping, dtype=torch.int64, device=device),
            q_index=None if len(pos) == num_seqs * max_chunk else qidx.to(device),
            mask=mask.to(device),
            num_seqs=num_seqs,
            max_chunk=max_chunk,
            max_cols=max_cols,
            row_cols=capacity * bs,
            sink_cols=sinks,
            sink_rows=sink_rows,
            group_size=group_size,
            scale=1.0 / math.sqrt(head_dim),
        )

    def _to_heads(self, q: Tensor) -> Tensor:
        """``[T, H, hd]`` -> ``[kvh, B, Cmax * g, hd]`` (padded)."""
        if self.q_index is not None:
            padded = q.new_zeros((self.num_seqs * self.max_chunk, *q.shape[1:]))
            padded.index_copy_(0, self.q_index, q)
            q = padded
        kvh = q.shape[1] // self.group_size
        q = q.view(self.num_seqs, self.max_chunk, kvh, self.group_size, q.shape[-1])
        return q.permute(2, 0, 1, 3, 4).reshape(kvh, self.num_seqs, self.max_chunk * self.group_size, -1)

    def attend(self, q: Tensor, q_sink: Tensor | None, k_view: Tensor, v_view: Tensor) -> Tensor:
        """Attention output ``[T, H * hd]``; ``k_view``/``v_view`` are ``[kvh, B * row_cols, hd]``."""
        kvh, _, hd = k_view.shape
        b, c, g, cols = self.num_seqs, self.max_chunk, self.group_size, self.max_cols
        # strided views, no copy: each row's first ``cols`` columns
        keys = k_view.view(kvh, b, self.row_cols, hd)[:, :, :cols]
        values = v_view.view(kvh, b, self.row_cols, hd)[:, :, :cols]
        if q_sink is None or not self.sink_cols:
            return self._attend_fused(q, keys, values)
        scores = torch.matmul(self._to_heads(q), keys.transpose(-1, -2))
        if q_sink is not None and self.sink_cols:
            s = self.sink_cols
            pinned = torch.matmul(self._to_heads(q_sink), keys[:, :, :s].transpose(-1, -2))
            if self.sink_rows is not None:  # a row pinning fewer columns scores the rest as window keys
                pinned = torch.where(self.sink_rows, pinned, scores[..., :s])
            scores[..., :s] = pinned
        scores.mul_(self.scale)
        scores.view(kvh, b, c, g, cols).add_(self.mask.view(1, b, c, 1, cols))
        probs = torch.softmax(scores, dim=-1)
        out = torch.matmul(probs, values)  # [kvh, B, C*g, hd]
        out = out.view(kvh, b, c, g, hd).permute(1, 2, 0, 3, 4).reshape(b * c, kvh * g * hd)
        if self.q_index is not None:
            out = out.index_select(0, self.q_index)
        return out

    def _attend_fused(self, q: Tensor, keys: Tensor, values: Tensor) -> Tensor:
        """``attend`` where every column is scored with the one query (no pinned column needs
        its in-cache query): torch's fused attention (SDPA, a flash kernel on the CPU), which
        never writes the ``[C * g, cols]`` scores out as the matmul path does, reading the
        view's strided rows in place and each kv head once for its query heads (GQA)."""
        b, c = self.num_seqs, self.max_chunk
        if self.q_index is not None:
            padded = q.new_zeros((b * c, *q.shape[1:]))
            padded.index_copy_(0, self.q_index, q)
            q = padded
        heads = q.view(b, c, q.shape[1], q.shape[2]).transpose(1, 2)  # [B, H, C, hd]
        out = F.scaled_dot_product_attention(
            heads,
            keys.transpose(0, 1),  # [B, kvh, cols, hd]
            values.transpose(0, 1),
            attn_mask=self.mask.view(b, 1, c, self.max_cols),
            scale=self.scale,
            enable_gqa=self.group_size > 1,
        )
        out = out.transpose(1, 2).reshape(b * c, -1)  # [B * C, H * hd]
        if self.q_index is not None:
            out = out.index_select(0, self.q_index)
        return out
