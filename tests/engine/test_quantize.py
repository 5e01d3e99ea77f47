"""Weight-only quantization on load: the blocks' accuracy, the on-disk cache, and a
quantized folder of each family computing what HF computes on the same (de-quantized)
weights, on the torch path and on the fused kernels (AMX tiles where this CPU has them)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from metronome_engine import EngineCore, KVPolicy, StepRequest, weights
from metronome_engine import kernels as fused_kernels
from metronome_engine.engine import Kernels
from metronome_engine.quant import QuantBlocks, Quantize, quantize_weight
from metronome_engine.quantized import block_weight_names, read_blocks

from .tiny import VOCAB, tiny_family, tiny_hf


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Quantized weights go to a fresh folder; the kernels are loaded first, so that
    their build folder stays the machine's."""
    fused_kernels.available()
    root = tmp_path / "cache"
    monkeypatch.setattr(weights, "cache_dir", lambda: root)
    yield root


@pytest.mark.parametrize("kind", ["q8_0", "q4_1"])
def test_blocks_round_each_weight_to_its_blocks_grid(kind: Quantize) -> None:
    w = torch.randn(48, 96, generator=torch.Generator().manual_seed(0)) * torch.logspace(-3, 1, 96)
    blocks = quantize_weight(w, kind)
    assert blocks.q.dtype == torch.int8 and blocks.q.shape == w.shape
    lo, hi = (0, 15) if kind == "q4_1" else (-127, 127)
    assert int(blocks.q.min()) >= lo and int(blocks.q.max()) <= hi
    assert (blocks.offset is None) == (kind == "q8_0")
    # scale and offset are float16 values, as GGUF stores them
    assert torch.equal(blocks.scale, blocks.scale.half().float())
    err = (blocks.dequantize() - w).abs().view(48, 3, 32)
    # within half a step of the grid, plus float16's rounding of scale and offset
    step = blocks.scale[..., None]
    assert bool((err <= 0.5 * step + 2e-3 * w.abs().view(48, 3, 32).amax(-1, keepdim=True)).all())
    assert float(err.max()) > 0  # it did quantize


def test_a_weight_whose_rows_do_not_split_into_blocks_of_32_is_refused() -> None:
    with pytest.raises(ValueError, match="K a multiple of 32"):
        quantize_weight(torch.zeros(4, 40), "q8_0")
    with pytest.raises(ValueError, match="quantize must be one of"):
        quantize_weight(torch.zeros(4, 32), "q3")  # type: ignore[arg-type]


def _dequantized_hf(hf: torch.nn.Module, kind: Quantize) -> torch.nn.Module:
    """``hf`` with every block weight replaced by its blocks' values: the reference."""
    names = block_weight_names(weights.ModelConfig.from_hf(hf.config.to_dict()))  # type: ignore[attr-defined]
    head = ("model.embed_tokens.weight", "lm_head.weight")
    with torch.no_grad():
        params = dict(hf.named_parameters())
        for name in names:
            params[name].copy_(quantize_weight(params[name], "q8_0" if name in head else kind).dequantize())
    return hf


@pytest.mark.parametrize("family", ["llama3", "qwen2", "qwen3"])
@pytest.mark.parametrize("kind", ["q8_0", "q4_1"])
def test_a_quantized_folder_computes_what_hf_computes_on_its_blocks(
    family: str, kind: Quantize, kernels: Kernels, cache: Path, tmp_path: Path
) -> None:
    hf = tiny_family(family, seed=2)
    hf.save_pretrained(tmp_path / family, safe_serialization=True)
    model = weights.load_model(tmp_path / family, quantize=kind)
    engine = EngineCore(model, policy=KVPolicy.full(), num_blocks=32, block_size=4, kernels=kernels)
    if kernels == "fused":
        assert model.tiles == fused_kernels.tiles_available()  # the blocks feed the tiles where they run
    tokens = torch.randint(0, VOCAB, (30,), generator=torch.Generator().manual_seed(3)).tolist()
    seq = engine.add_sequence()
    got = torch.cat(
        [
            engine.step([StepRequest(seq, tokens[a:b], all_logits=True)])[0].logits
            for a, b in ((0, 13), (13, 14), (14, 30))
        ]  # type: ignore[misc]
    )
    ref_model = _dequantized_hf(tiny_family(family, seed=2), kind)
    with torch.no_grad():
        ref = ref_model(torch.tensor([tokens])).logits[0]
        plain = hf(torch.tensor([tokens])).logits[0]
    assert float((got - ref).abs().max() / ref.abs().max()) < 1e-4
    assert float((got - plain).abs().max() / plain.abs().max()) > 1e-4  # the weights were quantized


def test_the_quantized_weights_are_written_once_and_read_after(cache: Path, tmp_path: Path) -> None:
    hf = tiny_hf(3)
    hf.save_pretrained(tmp_path / "m", safe_serialization=True)
    first = weights.load_model(tmp_path / "m", quantize="q4_1", device="cpu")
    files = list((cache / "quantized").glob("*.safetensors"))
    assert len(files) == 1
    stamp = files[0].stat().st_mtime_ns
    blocks = read_blocks(files[0])
    assert set(blocks) == set(block_weight_names(first.config))
    # 4-bit layers; the embedding (here also the head) at 8 bits, as llama.cpp's 4-bit files keep it
    assert all(isinstance(b, QuantBlocks) for b in blocks.values())
    assert all((b.offset is None) == (name == "model.embed_tokens.weight") for name, b in blocks.items())
    second = weights.load_model(tmp_path / "m", quantize="q4_1")
    assert files[0].stat().st_mtime_ns == stamp
    assert torch.equal(first.layers[0].qkv, second.layers[0].qkv)  # type: ignore[index]
    weights.load_model(tmp_path / "m", quantize="q8_0")
    assert len(list((cache / "quantized").glob("*.safetensors"))) == 2
    with pytest.raises(ValueError, match="quantize must be one of"):
        weights.load_model(tmp_path / "m", quantize="int4")  # type: ignore[arg-type]
