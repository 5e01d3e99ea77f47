"""The dense layers on AMX tiles (kernels/tiles.cpp) and the GGUF blocks they read (quant.py).

The kernel is held to float64 products of the de-quantized weights; the engine on tiles to
the torch path, and (test_smollm2.py) to HF transformers. Tiles are in the native build
only, where the CPU has them; the x86-64-v3 build (AVX2 machines) must keep a GGUF model's
float32 weights and agree with the torch path, checked here on every x86-64 machine.
"""

from __future__ import annotations

import logging
import platform

import pytest
import torch

from metronome_engine import EngineCore, KVPolicy, kernels
from metronome_engine.model import LlamaModel
from metronome_engine.quant import QuantBlocks, pack_tiles, read_gguf_blocks, tile_rows

from .tiny import scripted_logits, tiny_hf, tiny_runner

needs_tiles = pytest.mark.skipif(
    not kernels.get_build("native").tiles_available(),
    reason="this CPU (or OS) offers no AMX tiles; the engine keeps float32 weights",
)


def random_blocks(n: int, k: int, *, q4: bool, seed: int = 0) -> QuantBlocks:
    gen = torch.Generator().manual_seed(seed)
    if q4:
        q = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.int16)
        offset = (torch.randn(n, k // 32, generator=gen) * 0.15).half().float()
        scale = (torch.rand(n, k // 32, generator=gen) * 0.02 + 1e-3).half().float()
        return QuantBlocks(q, scale, offset)
    q = torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int16)
    return QuantBlocks(q, (torch.rand(n, k // 32, generator=gen) * 0.003 + 1e-4).half().float(), None)


@needs_tiles
@pytest.mark.parametrize("q4", [True, False])
@pytest.mark.parametrize("n, k", [(64, 64), (40, 96), (1000, 576), (48, 1536)])
def test_tile_linear_matches_the_dequantized_product(q4: bool, n: int, k: int) -> None:
    blocks = random_blocks(n, k, q4=q4)
    weight = blocks.dequantize().double()
    q, scale, offset = pack_tiles(blocks)
    for rows in (1, 5, 16, 17, 32, 33, 70):  # one tile, two, and more row groups, with remainders
        x, residual = torch.randn(rows, k), torch.randn(rows, n)
        out = kernels.get_build("native").ops.tile_linear(x, q, scale, offset if q4 else None, n, residual)
        ref = x.double() @ weight.t() + residual.double()
        # three bfloat16 parts carry x exactly; only float32 sums round
        assert float((out.double() - ref).abs().max() / ref.abs().max()) < 2e-6, (rows, n, k)


@needs_tiles
def test_how_the_threads_share_the_panels_changes_no_bit() -> None:
    """Threads take panel pairs from shared counters (a fast core helps a slow one), so
    which thread computes a panel varies from call to call; its result must not."""
    blocks = random_blocks(1000, 576, q4=True)
    q, scale, offset = pack_tiles(blocks)
    threads = torch.get_num_threads()
    try:
        for rows in (1, 33, 70):
            x = torch.randn(rows, 576)
            torch.set_num_threads(1)
            one = kernels.get_build("native").ops.tile_linear(x, q, scale, offset, 1000, None)
            torch.set_num_threads(max(2, threads))
            for _ in range(5):
                assert torch.equal(kernels.get_build("native").ops.tile_linear(x, q, scale, offset, 1000, None), one)
    finally:
        torch.set_num_threads(threads)


@needs_tiles
@pytest.mark.parametrize("residual", [False, True])
def test_an_output_larger_than_l2_is_streamed_to_the_same_values(residual: bool) -> None:
    """Past 4 MB the kernel writes with streaming stores (aligned full panels) and plain
    masked ones (the rest): 70 rows x 16376 columns is 4.6 MB, its last panel partial and
    half its rows not 64-byte aligned."""
    n, k = 16376, 64
    blocks = random_blocks(n, k, q4=False)
    q, scale, _ = pack_tiles(blocks)
    x = torch.randn(70, k)
    res = torch.randn(70, n) if residual else None
    out = kernels.get_build("native").ops.tile_linear(x, q, scale, None, n, res)
    ref = x.double() @ blocks.dequantize().double().t() + (res.double() if res is not None else 0)
    assert out.numel() * 4 > 4 << 20
    assert float((out.double() - ref).abs().max() / ref.abs().max()) < 2e-6


@needs_tiles
@pytest.mark.parametrize("q4", [True, False])
def test_tile_rows_are_the_dequantized_rows_bit_for_bit(q4: bool) -> None:
    blocks = random_blocks(50, 96, q4=q4)
    ids = torch.tensor([0, 15, 16, 17, 31, 49, 3])
    assert torch.equal(tile_rows(*pack_tiles(blocks), ids), blocks.dequantize()[ids])


@needs_tiles
def test_a_nan_row_stays_in_its_row() -> None:
    blocks = random_blocks(48, 64, q4=True)
    q, scale, offset = pack_tiles(blocks)
    x = torch.randn(20, 64)
    x[3, 7] = float("nan")
    out = kernels.get_build("native").ops.tile_linear(x, q, scale, offset, 48, None)
    assert out[3].isnan().all()
    assert out[torch.arange(20) != 3].isfinite().all()


@needs_tiles
def test_tile_linear_refuses_mismatched_input() -> None:
    q, scale, offset = pack_tiles(random_blocks(32, 64, q4=True))
    with pytest.raises(RuntimeError, match="columns"):
        kernels.get_build("native").ops.tile_linear(torch.randn(2, 96), q, scale, offset, 32, None)
    with pytest.raises(RuntimeError, match="n does not match"):
        kernels.get_build("native").ops.tile_linear(torch.randn(2, 64), q, scale, offset, 64, None)
    with pytest.raises(RuntimeError, match="offset"):
        kernels.get_build("native").ops.tile_linear(torch.randn(2, 64), q, scale, None, 32, None)
    with pytest.raises(RuntimeError, match="residual"):
        kernels.get_build("native").ops.tile_linear(torch.randn(2, 64), q, scale, offset, 32, torch.randn(3, 32))


@needs_tiles
def test_pack_tiles_refuses_blocks_it_cannot_hold() -> None:
    with pytest.raises(ValueError, match="divisible by 32"):
        pack_tiles(QuantBlocks(torch.zeros(16, 40, dtype=torch.int16), torch.ones(16, 1), None))
    with pytest.raises(ValueError, match=r"0\.\.15"):
        pack_tiles(QuantBlocks(torch.full((16, 32), 16, dtype=torch.int16), torch.ones(16, 1), torch.zeros(16, 1)))


def _block_model(seed: int = 0) -> tuple[LlamaModel, dict[str, QuantBlocks]]:
    """The tiny model with every dense weight exactly a set of GGUF blocks (the embedding
    8-bit, the rest 4-bit), and those blocks as its block source."""
    hf = tiny_hf(seed)
    state = hf.state_dict()
    blocks = {}
    for i, (name, weight) in enumerate(state.items()):
        if weight.dim() == 2 and name != "lm_head.weight":
            blocks[name] = random_blocks(*weight.shape, q4=name != "model.embed_tokens.weight", seed=i)
            state[name] = blocks[name].dequantize()
    model = tiny_runner(hf)
    model.load_hf_state_dict(state)
    model.block_source = lambda: blocks
    return model, blocks


@needs_tiles
@pytest.mark.parametrize("policy", [KVPolicy.full(), KVPolicy.windowed(12, sinks=4)])
def test_an_engine_on_tiles_equals_the_torch_engine(policy: KVPolicy) -> None:
    logits = {}
    for path in ("torch", "fused"):
        model, _ = _block_model()
        # the native build by name: `make test` also runs these with METRONOME_KERNELS_ISA=x86-64-v4
        engine = EngineCore(model, policy=policy, num_blocks=96, block_size=4, kernels=path, isa="native")
        assert model.tiles == (path == "fused")
        logits[path] = scripted_logits(engine)
    ref = logits["torch"]
    assert float((logits["fused"] - ref).abs().max() / ref.abs().max()) < 1e-4


@needs_tiles
def test_blocks_that_differ_from_the_weights_leave_float32_weights(caplog: pytest.LogCaptureFixture) -> None:
    model, blocks = _block_model()
    name = "model.layers.1.mlp.down_proj.weight"
    b = blocks[name]
    blocks[name] = QuantBlocks(b.q, b.scale * 2, b.offset)  # not the weights the model holds
    with caplog.at_level(logging.WARNING, logger="metronome_engine.model"):
        assert not model.pack_weights(kernels.get_build("native"))
    assert not model.packed and not model.tiles
    assert "differ from the loaded weights" in caplog.text
    assert model.layers[0].qkv.dtype == torch.float32


@needs_tiles
def test_pack_weights_can_be_told_to_keep_float32_weights() -> None:
    model, _ = _block_model()
    assert not model.pack_weights(kernels.get_build("native"), tiles=False)
    assert not model.packed and not model.tiles


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="the x86-64-v3 build is for x86-64 CPUs")
@pytest.mark.parametrize("policy", [KVPolicy.full(), KVPolicy.windowed(12, sinks=4)])
def test_the_x86_64_v3_build_keeps_a_gguf_models_float32_weights(policy: KVPolicy) -> None:
    logits = {}
    for path in ("torch", "fused"):
        model, _ = _block_model()
        engine = EngineCore(model, policy=policy, num_blocks=96, block_size=4, kernels=path, isa="x86-64-v3")
        assert not kernels.get_build("x86-64-v3").tiles_available()  # loads the build first
        assert not model.packed
        logits[path] = scripted_logits(engine)
    ref = logits["torch"]
    assert float((logits["fused"] - ref).abs().max() / ref.abs().max()) < 1e-4


@needs_tiles
def test_a_model_in_tiles_refuses_an_engine_of_a_build_without_them() -> None:
    model, _ = _block_model()
    EngineCore(model, policy=KVPolicy.full(), num_blocks=16, block_size=4, kernels="fused", isa="native")
    with pytest.raises(ValueError, match="x86-64-v3 build cannot read"):
        EngineCore(model, policy=KVPolicy.full(), num_blocks=16, block_size=4, kernels="fused", isa="x86-64-v3")


@needs_tiles
@pytest.mark.real_model
def test_smollm2_gguf_blocks_are_its_loaded_weights_bit_for_bit() -> None:
    from safetensors.torch import load_file

    from metronome_engine.weights import DEFAULT_MODEL, load_model, resolve_model_dir, smollm2_gguf_path

    model = load_model(DEFAULT_MODEL)
    blocks = read_gguf_blocks(smollm2_gguf_path(), model.config)
    state = load_file(str(resolve_model_dir(DEFAULT_MODEL) / "model.safetensors"))
    assert set(blocks) == {n for n, t in state.items() if t.dim() == 2}  # every dense weight, tied head once
    for name, b in blocks.items():
        assert torch.equal(b.dequantize(), state[name]), name
    model.pack_weights(kernels.get_build("native"))
    assert model.tiles
