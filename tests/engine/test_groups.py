"""Dense layers read from column groups of 4-/8-bit blocks (kernels/groups.cpp, quant.pack_groups).

The kernel is held to float64 products of the de-quantized weights in each build (native
x86-64-v3 and generic); an engine whose steps read the groups, to the torch path; SmolLM2 on the
groups, to HF transformers (test_smollm2.py).
"""

from __future__ import annotations

import platform
from typing import Any

import pytest
import torch

from metronome_engine import EngineCore, KVPolicy
from metronome_engine.kernels import get_build
from metronome_engine.kernels.choice import REGIMES
from metronome_engine.quant import QuantBlocks, pack_groups

from .conftest import BUILDS
from .test_tiles import _block_model, random_blocks
from .tiny import scripted_logits

_X86 = platform.machine() in ("x86_64", "AMD64")


@pytest.fixture(params=BUILDS)
def ops(request: pytest.FixtureRequest) -> Any:
    build = get_build(request.param)
    build.load()  # every build this machine can run must build here: a failure, not a skip
    return build.ops


@pytest.mark.parametrize("q4", [True, False])
@pytest.mark.parametrize("n, k", [(64, 64), (42, 96), (1001, 576), (48, 1536), (40, 352)])
def test_group_linear_matches_the_dequantized_product(ops: Any, q4: bool, n: int, k: int) -> None:
    blocks = random_blocks(n, k, q4=q4)
    weight = blocks.dequantize().double()
    groups = pack_groups(blocks)
    # up to 3 rows passes of 2 and 1 rows; from 4 rows the panels: whole tiles of 4 rows
    # and a partial one, panels of 24 columns and a partial one, chunks of k (K = 576 and
    # 1536 in equal ones, 352 in 192 and a shorter one)
    for rows in (1, 2, 3, 4, 7, 8, 15, 33, 64):
        x, residual = torch.randn(rows, k), torch.randn(rows, n)
        for res in (None, residual):
            out = ops.group_linear(x, groups, n, res)
            ref = x.double() @ weight.t() + (res.double() if res is not None else 0)
            assert float((out.double() - ref).abs().max() / ref.abs().max()) < 2e-6, (rows, n, k)
            assert torch.equal(ops.linear(x, groups, torch.empty(0), torch.empty(0), n, res), out)


@pytest.mark.parametrize("rows", [3, 40])  # passes, panels
def test_group_linear_gives_the_same_bits_on_any_thread_count(ops: Any, rows: int) -> None:
    groups = pack_groups(random_blocks(1000, 576, q4=True))
    x = torch.randn(rows, 576)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = ops.group_linear(x, groups, 1000, None)
        torch.set_num_threads(max(2, threads))
        assert torch.equal(ops.group_linear(x, groups, 1000, None), one)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("rows", [3, 37])  # passes, panels
def test_a_nan_row_stays_in_its_row(ops: Any, rows: int) -> None:
    groups = pack_groups(random_blocks(48, 64, q4=True))
    x = torch.randn(rows, 64)
    x[1, 7] = float("nan")
    out = ops.group_linear(x, groups, 48, None)
    assert out[1].isnan().all()
    assert out[torch.arange(rows) != 1].isfinite().all()


def test_group_linear_refuses_mismatched_input(ops: Any) -> None:
    groups = pack_groups(random_blocks(32, 64, q4=True))
    with pytest.raises(RuntimeError, match="columns"):
        ops.group_linear(torch.randn(2, 96), groups, 32, None)
    with pytest.raises(RuntimeError, match="n does not match"):
        ops.group_linear(torch.randn(2, 64), groups, 40, None)
    with pytest.raises(RuntimeError, match="residual"):
        ops.group_linear(torch.randn(2, 64), groups, 32, torch.randn(3, 32))
    with pytest.raises(RuntimeError, match="groups must be"):
        ops.group_linear(torch.randn(2, 64), groups[..., :70].contiguous(), 32, None)
    with pytest.raises(RuntimeError, match="float32"):
        ops.group_linear(torch.randn(2, 64).double(), groups, 32, None)


def test_pack_groups_lays_out_each_column_as_gguf_does() -> None:
    blocks = random_blocks(6, 64, q4=True)
    g = pack_groups(blocks)
    assert g.shape == (2, 2, 80) and g.dtype == torch.uint8
    # group 1, block 1, its second column (n = 5): element j low nibble, j + 16 high
    rec = g[1, 1]
    col = rec[16:32].to(torch.int16)
    assert torch.equal(torch.cat([col & 0x0F, col >> 4]), blocks.q[5, 32:64].to(torch.int16))
    halves = rec[64:80].contiguous().view(torch.float16).float()
    assert halves[1] == blocks.scale[5, 1] and halves[5] == blocks.offset[5, 1]  # type: ignore[index]
    assert torch.equal(rec[48:64], torch.zeros(16, dtype=torch.uint8))  # past N: zero
    assert pack_groups(random_blocks(6, 64, q4=False)).shape == (2, 2, 136)


def test_pack_groups_refuses_blocks_it_cannot_hold() -> None:
    with pytest.raises(ValueError, match="divisible by 32"):
        pack_groups(QuantBlocks(torch.zeros(4, 40, dtype=torch.int16), torch.ones(4, 1), None))
    with pytest.raises(ValueError, match=r"0\.\.15"):
        pack_groups(QuantBlocks(torch.full((4, 32), 16, dtype=torch.int16), torch.ones(4, 1), torch.zeros(4, 1)))
    with pytest.raises(ValueError, match="float16"):
        pack_groups(QuantBlocks(torch.zeros(4, 32, dtype=torch.int16), torch.full((4, 1), 0.1), None))


@pytest.mark.parametrize("isa", BUILDS)
@pytest.mark.parametrize("policy", [KVPolicy.full(), KVPolicy.windowed(12, sinks=4)])
def test_an_engine_reading_the_groups_equals_the_torch_engine(isa: str, policy: KVPolicy) -> None:
    model, _ = _block_model()
    assert model.pack_groups() and model.grouped and not model.packed
    engine = EngineCore(model, policy=policy, num_blocks=96, block_size=4, kernels="fused", isa=isa)  # type: ignore[arg-type]
    engine.pin_paths(dict.fromkeys(REGIMES, "groups"))
    got = scripted_logits(engine)
    plain = EngineCore(_block_model()[0], policy=policy, num_blocks=96, block_size=4, kernels="torch")
    ref = scripted_logits(plain)
    assert float((got - ref).abs().max() / ref.abs().max()) < 1e-4


@pytest.mark.skipif(not _X86, reason="the x86-64-v3 build is for x86-64 CPUs")
def test_pin_paths_refuses_what_cannot_run() -> None:
    model, _ = _block_model()
    torch_engine = EngineCore(model, policy=KVPolicy.full(), num_blocks=16, block_size=4, kernels="torch")
    with pytest.raises(ValueError, match="kernels='fused'"):
        torch_engine.pin_paths({"decode_1": "groups"})
    with pytest.raises(ValueError, match="unknown regimes"):
        torch_engine.pin_paths({"decode_2": "torch"})
    with pytest.raises(ValueError, match="'torch', 'fused' or 'groups'"):
        torch_engine.pin_paths({"decode_1": "tiles"})  # type: ignore[dict-item]
    model.block_source = None
    fused = EngineCore(model, policy=KVPolicy.full(), num_blocks=16, block_size=4, kernels="fused", isa="x86-64-v3")
    with pytest.raises(ValueError, match="no blocks"):
        fused.pin_paths({"decode_1": "groups"})
