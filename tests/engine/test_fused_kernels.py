"""The fused CPU kernels (kernels/ops.cpp), op by op, against plain torch.

The end-to-end checks (logits equal HF transformers and the dense sinks+window
reference) run on both paths through the ``kernels`` fixture; here each op meets its
torch reference on shapes the model tests do not reach: head sizes with and without
a vector path, row counts that leave remainder tiles, block tables in any pool order.
Every test here runs on each vector-unit build that this machine can run (the native
one, the generic one that stands for aarch64's plain paths, and on x86-64 the x86-64-v3
one that stands for AVX2 machines and, where the CPU has AVX-512, the x86-64-v4 one that
stands for AVX-512 machines without tiles), or on the one build a run is held to.
"""

from __future__ import annotations

import itertools
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from metronome_engine import EngineCore, KVPolicy, ModelConfig, StepRequest, kernels
from metronome_engine.engine import auto_choice, resolve_kernels
from metronome_engine.kernels import ISAS, KernelBuild, get_build
from metronome_engine.model import LlamaModel, apply_rope, rope_cos_sin
from tests.support import FailingCompiler

from .conftest import BUILDS
from .tiny import VOCAB, scripted_logits, tiny_engine

pytestmark = pytest.mark.usefixtures("one_torch_thread")

_ROOT = Path(__file__).parents[2]


@pytest.fixture(scope="module", params=BUILDS)
def build(request: pytest.FixtureRequest) -> KernelBuild:
    # they must build on this machine kind: a failure here is a failure, not a skip
    b = get_build(request.param)
    b.load()
    return b


@pytest.fixture
def ops(build: KernelBuild) -> Any:
    return build.ops


def test_rms_norm_and_silu_mul_match_torch(ops: Any) -> None:
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(7, 96, generator=gen) * 3
    w = torch.randn(96, generator=gen)
    ref = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * w
    torch.testing.assert_close(ops.rms_norm(x, w, 1e-5), ref, rtol=1e-5, atol=1e-5)
    gu = torch.randn(5, 2 * 40, generator=gen) * 6
    gate, up = gu.chunk(2, dim=-1)
    torch.testing.assert_close(ops.silu_mul(gu), F.silu(gate) * up, rtol=1e-5, atol=1e-5)


def test_silu_mul_clamps_its_exp_and_keeps_nan(ops: Any) -> None:
    # beyond exp's float32 range the kernel clamps its argument; a NaN gate stays NaN
    gate = torch.tensor([[-200.0, -90.0, -87.5, 0.0, 88.5, 200.0, float("nan"), 3.0] * 4])
    up = torch.linspace(-2, 2, gate.shape[1])[None]
    got = ops.silu_mul(torch.cat([gate, up], dim=1))
    torch.testing.assert_close(got, F.silu(gate) * up, rtol=1e-5, atol=1e-5, equal_nan=True)
    assert got.isnan().sum() == 4


def test_greedy_rows_matches_argmax_and_flags_non_finite_rows(ops: Any) -> None:
    gen = torch.Generator().manual_seed(2)
    logits = torch.randn(6, 1000 + 7, generator=gen)  # a vocabulary that leaves a tail
    logits[1, 1006] = 50.0  # the maximum in the tail
    logits[2, 10] = logits[2, 900] = 60.0  # a tie: the first one, as torch.argmax
    logits[3, 5] = float("nan")
    logits[4, 7] = float("inf")
    logits[5, 1003] = float("-inf")
    best, finite = ops.greedy_rows(logits)
    assert finite.tolist() == [True, True, True, False, False, False]
    assert best[:3].tolist() == logits[:3].argmax(-1).tolist() and best[1] == 1006 and best[2] == 10


@pytest.mark.parametrize("vocab", [1, 5, 31, 32, 33, 49152])
def test_greedy_rows_takes_the_first_of_tied_maxima_in_any_lane(ops: Any, vocab: int) -> None:
    # the kernel keeps a maximum per vector lane: ties within one lane, across lanes and
    # between the lanes and the tail must all give the first index, as torch.argmax
    gen = torch.Generator().manual_seed(vocab)
    logits = torch.randint(-3, 3, (8, vocab), generator=gen).float()  # many ties
    for row, spots in enumerate([[0], [vocab - 1], [3, 35], [40, 8], [vocab // 2, vocab - 1]]):
        logits[row, [s for s in spots if s < vocab]] = 9.0
    logits[5] = float("-inf")  # finite is False, the choice the first index
    logits[6] = -1.0
    best, finite = ops.greedy_rows(logits)
    assert best.tolist() == logits.argmax(-1).tolist()
    assert finite.tolist() == [True] * 5 + [False, True, True]


@pytest.mark.parametrize("rows", [1, 5, 32, 40])
@pytest.mark.parametrize(("k", "n"), [(64, 96), (48, 70)])
def test_linear_on_float32_weights_matches_mm(ops: Any, rows: int, k: int, n: int) -> None:
    gen = torch.Generator().manual_seed(rows * 1000 + n)
    x = torch.randn(rows, k, generator=gen)
    w = torch.randn(k, n, generator=gen)
    res = torch.randn(rows, n, generator=gen)
    empty = torch.empty(0)
    torch.testing.assert_close(ops.linear(x, w, empty, empty, n, None), x @ w, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(ops.linear(x, w, empty, empty, n, res), res + x @ w, rtol=1e-4, atol=1e-4)


def test_linear_refuses_mismatched_shapes(ops: Any) -> None:
    w, empty = torch.randn(16, 40), torch.empty(0)
    with pytest.raises(RuntimeError, match="columns"):
        ops.linear(torch.randn(2, 17), w, empty, empty, 40, None)
    with pytest.raises(RuntimeError, match="n = 80"):
        ops.linear(torch.randn(2, 16), w, empty, empty, 80, None)
    with pytest.raises(RuntimeError, match="float32"):
        ops.linear(torch.randn(2, 16, dtype=torch.float64), w, empty, empty, 40, None)
    with pytest.raises(RuntimeError, match="residual"):
        ops.linear(torch.randn(2, 16), w, empty, empty, 40, torch.randn(3, 40))


def test_rope_store_rotates_and_writes_the_pool(ops: Any) -> None:
    gen = torch.Generator().manual_seed(1)
    heads, kvh, hd, t = 6, 2, 16, 5
    qkv = torch.randn(t, (heads + 2 * kvh) * hd, generator=gen)
    inv_freq = 1.0 / (10000 ** (torch.arange(0, hd, 2).float() / hd))
    pos = torch.tensor([0, 3, 9, 10, 40])
    sink_pos = torch.tensor([0, 3, 4, 4, 5])
    cos, sin = rope_cos_sin(inv_freq, pos)
    scos, ssin = rope_cos_sin(inv_freq, sink_pos)
    slots = torch.tensor([7, 0, 12, 3, 5])
    k_cache, v_cache = torch.zeros(kvh, 16, hd), torch.zeros(kvh, 16, hd)
    q, q_sink = ops.rope_store(qkv, cos, sin, scos, ssin, slots, k_cache, v_cache, heads)
    q_ref, k_ref, v_ref = qkv.split([heads * hd, kvh * hd, kvh * hd], dim=-1)
    torch.testing.assert_close(q, apply_rope(q_ref.view(t, heads, hd), cos, sin))
    torch.testing.assert_close(q_sink, apply_rope(q_ref.view(t, heads, hd), scos, ssin))
    torch.testing.assert_close(k_cache[:, slots], apply_rope(k_ref.view(t, kvh, hd), cos, sin).transpose(0, 1))
    torch.testing.assert_close(v_cache[:, slots], v_ref.view(t, kvh, hd).transpose(0, 1))
    untouched = torch.ones(16, dtype=torch.bool)
    untouched[slots] = False
    assert (k_cache[:, untouched] == 0).all() and (v_cache[:, untouched] == 0).all()


def _attention_reference(
    q: torch.Tensor,
    q_sink: torch.Tensor | None,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    tables: list[list[tuple[int, int]]],
    chunks: list[list[int]],
    bs: int,
    window: int,
    sinks: int,
) -> torch.Tensor:
    heads, hd = q.shape[1], q.shape[2]
    kvh = k_cache.shape[0]
    out = torch.empty(q.shape[0], heads * hd)
    row = 0
    for table, positions in zip(tables, chunks, strict=True):
        stream = torch.tensor([lb * bs + j for lb, _ in table for j in range(bs)])
        slots = torch.tensor([pb * bs + j for _, pb in table for j in range(bs)])
        for t in positions:
            if window > 0:
                lo = max(sinks, t - window + 1)
                is_sink = stream < min(sinks, t + 1)
                seen = is_sink | ((stream >= lo) & (stream <= t))
            else:
                is_sink = torch.zeros_like(stream, dtype=torch.bool)
                seen = stream <= t
            k = k_cache[:, slots[seen]].repeat_interleave(heads // kvh, dim=0)  # [H, n, hd]
            v = v_cache[:, slots[seen]].repeat_interleave(heads // kvh, dim=0)
            scores = torch.einsum("hd,hnd->hn", q[row], k)
            if q_sink is not None:
                sink_scores = torch.einsum("hd,hnd->hn", q_sink[row], k)
                scores = torch.where(is_sink[seen][None, :], sink_scores, scores)
            probs = torch.softmax(scores / math.sqrt(hd), dim=-1)
            out[row] = torch.einsum("hn,hnd->hd", probs, v).reshape(-1)
            row += 1
    return out


# (tokens held, tokens added) per session: a decode step, a chunk that crosses blocks, and a
# long one with holes; or chunks of 16+ rows, which run on chunk_attention's tiles (a prompt
# from empty, one onto a held context, and, beside them, a decode step on the fold)
_FEW_ROWS = [(7, 1), (13, 6), (61, 3)]
_MANY_ROWS = [(7, 1), (0, 37), (30, 20)]


@pytest.mark.parametrize("hd", [16, 64, 24])  # 24: no vector path in the fold, the plain loops
@pytest.mark.parametrize(("window", "sinks"), [(0, 0), (9, 0), (9, 3), (20, 5)])
@pytest.mark.parametrize("group", [1, 3])
@pytest.mark.parametrize("lengths", [_FEW_ROWS, _MANY_ROWS], ids=["few-rows", "many-rows"])
def test_paged_attention_matches_a_dense_reference(
    ops: Any, hd: int, window: int, sinks: int, group: int, lengths: list[tuple[int, int]]
) -> None:
    gen = torch.Generator().manual_seed(hd * 100 + window * 10 + sinks + group + 1000 * lengths[1][1])
    bs, kvh = 4, 2
    heads = kvh * group
    num_blocks = 40
    k_cache = torch.randn(kvh, num_blocks * bs, hd, generator=gen)
    v_cache = torch.randn(kvh, num_blocks * bs, hd, generator=gen)
    order = torch.randperm(num_blocks, generator=gen).tolist()  # blocks anywhere in the pool
    tables, chunks = [], []
    for length, n_new in lengths:
        end = length + n_new
        wanted = set(range(math.ceil(end / bs)))
        if window > 0:  # what a windowed session still holds: sinks' blocks and the window's
            first_query = length
            lo = max(sinks, first_query - window + 1)
            wanted = {lb for lb in wanted if lb * bs < sinks or (lb + 1) * bs > lo}
        tables.append([(lb, order.pop()) for lb in sorted(wanted)])
        chunks.append(list(range(length, end)))
    t = sum(len(c) for c in chunks)
    q = torch.randn(t, heads, hd, generator=gen)
    q_sink = torch.randn(t, heads, hd, generator=gen) if sinks else None
    width = max(len(tb) for tb in tables)
    logical = torch.full((3, width), -1, dtype=torch.int64)
    physical = torch.zeros((3, width), dtype=torch.int64)
    for b, tb in enumerate(tables):
        logical[b, : len(tb)] = torch.tensor([lb for lb, _ in tb])
        physical[b, : len(tb)] = torch.tensor([pb for _, pb in tb])
    starts = torch.tensor([0, *itertools.accumulate(n for _, n in lengths)])
    positions = torch.tensor([p for c in chunks for p in c])
    got = ops.paged_attention(
        q,
        q_sink,
        k_cache,
        v_cache,
        starts,
        positions,
        logical,
        physical,
        torch.tensor([len(tb) for tb in tables]),
        bs,
        window,
        sinks,
        1 / math.sqrt(hd),
    )
    ref = _attention_reference(q, q_sink, k_cache, v_cache, tables, chunks, bs, window, sinks)
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-5)


def test_paged_attention_carries_a_nan_to_its_own_session_only(ops: Any) -> None:
    kvh, hd, bs = 1, 64, 4
    k_cache, v_cache = torch.randn(kvh, 8 * bs, hd), torch.randn(kvh, 8 * bs, hd)
    k_cache[0, 5] = float("nan")  # block 1, held by session 0
    logical = torch.tensor([[0, 1], [0, 1]])
    physical = torch.tensor([[0, 1], [2, 3]])
    out = ops.paged_attention(
        torch.randn(2, 2, hd),
        None,
        k_cache,
        v_cache,
        torch.tensor([0, 1, 2]),
        torch.tensor([6, 6]),
        logical,
        physical,
        torch.tensor([2, 2]),
        bs,
        0,
        0,
        0.125,
    )
    assert out[0].isnan().all() and out[1].isfinite().all()


def test_a_chunks_nan_key_reaches_the_rows_that_see_it_only(ops: Any) -> None:
    # 20 rows: chunk_attention's tiles; the key at stream index 9 is NaN
    kvh, hd, bs, rows = 1, 64, 4, 20
    k_cache, v_cache = torch.randn(kvh, 12 * bs, hd), torch.randn(kvh, 12 * bs, hd)
    k_cache[0, 9] = float("nan")
    out = ops.paged_attention(
        torch.randn(rows + 1, 3, hd),
        None,
        k_cache,
        v_cache,
        torch.tensor([0, rows, rows + 1]),
        torch.tensor([*range(rows), 6]),
        torch.tensor([[0, 1, 2, 3, 4], [0, 1, -1, -1, -1]]),
        torch.tensor([[0, 1, 2, 3, 4], [8, 9, 0, 0, 0]]),
        torch.tensor([5, 2]),
        bs,
        0,
        0,
        0.125,
    )
    assert out[:9].isfinite().all() and out[9:rows].isnan().all() and out[rows].isfinite().all()


def test_paged_attention_refuses_a_block_outside_the_pool(ops: Any) -> None:
    kv = torch.randn(1, 8, 16)
    with pytest.raises(RuntimeError, match="out of the pool"):
        ops.paged_attention(
            torch.randn(1, 1, 16),
            None,
            kv,
            kv,
            torch.tensor([0, 1]),
            torch.tensor([0]),
            torch.tensor([[0]]),
            torch.tensor([[2]]),  # slots 8-11 of an 8-slot pool
            torch.tensor([1]),
            4,
            0,
            0,
            0.25,
        )


def _smollm2_shaped(seed: int) -> LlamaModel:
    """SmolLM2's head layout (head_dim 64, 3 query heads per kv head) at a tiny width."""
    torch.manual_seed(seed)
    cfg = ModelConfig(
        vocab_size=VOCAB,
        hidden_size=192,
        intermediate_size=160,
        num_layers=2,
        num_heads=3,
        num_kv_heads=1,
        head_dim=64,
    )
    model = LlamaModel(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * (0.2 if p.dim() > 1 else 1.0))
    return model


@pytest.mark.parametrize("policy", [KVPolicy.full(), KVPolicy.windowed(12, sinks=4)])
def test_fused_engine_equals_the_torch_engine_on_smollm2s_head_layout(build: KernelBuild, policy: KVPolicy) -> None:
    logits = {}
    for path in ("torch", "fused"):
        engine = EngineCore(
            _smollm2_shaped(3), policy=policy, num_blocks=96, block_size=16, kernels=path, isa=build.isa
        )
        assert engine.isa == (build.isa if path == "fused" else None)
        logits[path] = scripted_logits(engine)
    ref = logits["torch"]
    assert float((logits["fused"] - ref).abs().max() / ref.abs().max()) < 1e-4


def test_without_tiles_the_fused_and_torch_engines_share_one_model(build: KernelBuild) -> None:
    # float32 weights stay as loaded: no packed copy, and a torch engine can serve the model too
    model = _smollm2_shaped(5)
    before = [p.data_ptr() for p in model.parameters()]
    fused = EngineCore(model, policy=KVPolicy.full(), num_blocks=16, kernels="fused", isa=build.isa)
    plain = EngineCore(model, policy=KVPolicy.full(), num_blocks=16, kernels="torch")
    assert not model.packed and [p.data_ptr() for p in model.parameters()] == before
    a = fused.step([StepRequest(fused.add_sequence(), [1, 2, 3], return_logits=True)])[0].logits
    b = plain.step([StepRequest(plain.add_sequence(), [1, 2, 3], return_logits=True)])[0].logits
    assert a is not None and b is not None
    assert float((a - b).abs().max() / b.abs().max()) < 1e-4


def test_unknown_kernels_value_names_the_choices() -> None:
    with pytest.raises(ValueError, match="'auto', 'fused' or 'torch'"):
        tiny_engine(KVPolicy.full(), kernels="fast")  # type: ignore[arg-type]


# a process whose kernels cannot build: its builds are its own, so it starts afresh (this one's are loaded)
_NO_BUILD = """
import torch
from metronome_engine import KVPolicy, StepRequest, kernels
from metronome_engine.engine import resolve_kernels
from tests.engine.tiny import tiny_engine

engine = tiny_engine(KVPolicy.windowed(8, sinks=2), kernels="auto")
assert not engine.fused and engine.isa is None and engine.regimes is None and not engine.model.packed
out = engine.step([StepRequest(engine.add_sequence(), [1, 2, 3])])[0]
assert out.ok and out.token is not None
assert resolve_kernels("auto", torch.device("cpu"), engine.config) == "torch"
try:
    tiny_engine(KVPolicy.full(), kernels="fused")
except kernels.KernelBuildError as exc:
    print("fused:", exc)
"""


def test_where_the_kernels_cannot_build_auto_runs_torch_and_fused_says_why(tmp_path: Path) -> None:
    compiler = FailingCompiler(tmp_path / "bin")
    env = {**os.environ, "CXX": str(compiler.path), "METRONOME_CACHE": str(tmp_path / "cache")}
    done = subprocess.run(
        [sys.executable, "-W", "error", "-c", _NO_BUILD],
        cwd=_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "fused CPU kernels" in done.stderr and "unavailable" in done.stderr  # said once, as a warning
    assert done.stdout.startswith("fused: ") and "unknown value 'native' for -mcpu" in done.stdout  # why
    assert compiler.calls  # the build was tried, with this machine's compiler: the failing one


def test_an_edited_kernel_source_builds_into_a_new_folder(build: KernelBuild, tmp_path: Path) -> None:
    # a stale library must never be loaded for a changed source: the cache key covers it
    before = build.build_dir()
    edited = tmp_path / "ops.cpp"
    edited.write_bytes(build.sources[0].read_bytes() + b"\n// edited\n")
    after = KernelBuild(build.isa, sources=(edited, *build.sources[1:])).build_dir()
    assert after != before and after.parent == before.parent
    assert KernelBuild(build.isa).build_dir() == before  # the same sources: the same folder


def test_each_build_has_its_own_folder_and_op_namespace() -> None:
    builds = [get_build(isa) for isa in ISAS]
    assert len({b.build_dir() for b in builds}) == len({b.namespace for b in builds}) == len(ISAS)
    assert get_build("native").namespace == "metronome"


def test_the_isa_variable_picks_the_default_build(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(kernels.ISA_ENV, "x86-64-v3")
    assert kernels.default_isa() == "x86-64-v3" and get_build().isa == "x86-64-v3"
    monkeypatch.setenv(kernels.ISA_ENV, "avx9")
    with pytest.raises(ValueError, match="METRONOME_KERNELS_ISA must be one of native, x86-64-v4, x86-64-v3, generic"):
        get_build()


def test_resolve_kernels_names_the_path_an_engine_runs() -> None:
    cpu = torch.device("cpu")
    assert resolve_kernels("torch", cpu) == "torch"
    assert resolve_kernels("fused", cpu) == "fused"
    config = _smollm2_shaped(0).config
    assert resolve_kernels("auto", cpu, config) == auto_choice(config).path
    assert resolve_kernels("auto", torch.device("meta")) == "torch"
    with pytest.raises(ValueError, match="CPU only"):
        resolve_kernels("fused", torch.device("meta"))
    # where the build fails, "auto" is torch: test_where_the_kernels_cannot_build_auto_runs_torch...
