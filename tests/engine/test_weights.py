"""Loading weights: a plain Hugging Face Llama folder, and bad folders."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from metronome_engine import EngineCore, KVPolicy, StepRequest
from metronome_engine.weights import load_model

from .tiny import VOCAB, tiny_hf


def test_an_hf_safetensors_folder_loads_and_matches_hf(tmp_path: Path) -> None:
    hf = tiny_hf(8, tie=False)
    hf.save_pretrained(tmp_path, safe_serialization=True)
    engine = EngineCore(load_model(tmp_path), policy=KVPolicy.full(), num_blocks=16, block_size=4)
    seq = engine.add_sequence()
    tokens = [5, 17, 42, 8, 91, 3]
    out = engine.step([StepRequest(seq, tokens, all_logits=True)])[0]
    with torch.no_grad():
        ref = hf(torch.tensor([tokens])).logits[0]
    assert out.logits is not None and out.logits.shape == (len(tokens), VOCAB)
    assert float((out.logits - ref).abs().max() / ref.abs().max()) < 1e-4


def test_a_folder_without_weights_or_of_another_architecture_is_refused(tmp_path: Path) -> None:
    hf = tiny_hf(8)
    config = hf.config.to_dict()
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"no \.safetensors weights"):
        load_model(tmp_path)
    config["model_type"] = "gpt2"
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match="not a family this runner serves"):
        load_model(tmp_path)
