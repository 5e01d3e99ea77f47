"""Reading a Hugging Face config.json: each family's options, and every option the runner
cannot honour refused by name."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from metronome_engine import EngineCore, KVPolicy, ModelConfig
from metronome_engine.config import RopeScaling
from metronome_engine.model import LlamaModel, RopeTable, rope_cos_sin, rope_inv_freq

from .tiny import FAMILY_CONFIGS, tiny_family


def _config(**changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "model_type": "llama",
        "vocab_size": 97,
        "hidden_size": 64,
        "intermediate_size": 96,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
    }
    return base | changes


@pytest.mark.parametrize(
    ("family", "expected"),
    [
        ("qwen2", {"qkv_bias": True, "o_bias": False, "qk_norm": False, "tie_word_embeddings": True}),
        ("qwen3", {"qkv_bias": False, "o_bias": False, "qk_norm": True}),
        ("qwen3-untied-bias", {"qkv_bias": True, "o_bias": True, "qk_norm": True, "tie_word_embeddings": False}),
        ("llama-attention-bias", {"qkv_bias": True, "o_bias": True, "qk_norm": False}),
        ("llama3", {"tie_word_embeddings": False, "qkv_bias": False}),
        ("mistral", {"sliding_window": None, "model_type": "mistral"}),
    ],
)
def test_each_familys_options_are_read_from_its_hf_config(family: str, expected: dict[str, Any]) -> None:
    config = ModelConfig.from_hf(tiny_family(family).config.to_dict())
    assert {k: getattr(config, k) for k in expected} == expected


def test_rope_scaling_is_read_from_old_and_new_config_files() -> None:
    llama3 = {"rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0}
    old = ModelConfig.from_hf(_config(rope_scaling=llama3 | {"original_max_position_embeddings": 8192}))
    new = ModelConfig.from_hf(
        _config(rope_parameters=llama3 | {"rope_theta": 500000.0, "original_max_position_embeddings": 8192})
    )
    assert old.rope_scaling == new.rope_scaling == RopeScaling(kind="llama3", factor=32.0)
    assert new.rope_theta == 500000.0
    linear = ModelConfig.from_hf(_config(rope_scaling={"type": "linear", "factor": 2.0}))
    assert linear.rope_scaling == RopeScaling(kind="linear", factor=2.0)


@pytest.mark.parametrize("family", ["llama3", "llama-linear-rope"])
def test_scaled_rope_frequencies_equal_hf_transformers(family: str) -> None:
    hf = tiny_family(family)
    ours = rope_inv_freq(ModelConfig.from_hf(hf.config.to_dict()))
    plain = rope_inv_freq(ModelConfig.from_hf(hf.config.to_dict() | {"rope_scaling": None, "rope_parameters": None}))
    assert torch.equal(ours, hf.model.rotary_emb.inv_freq)
    assert not torch.equal(ours, plain)


def test_rope_table_rows_equal_the_angles_computed_directly() -> None:
    # the table grows past 1024 positions, stops at its limit, and beyond it computes directly
    inv = rope_inv_freq(ModelConfig.from_hf(_config(rope_theta=100000.0)))
    table = RopeTable(limit=4096)
    for positions in ([0, 5, 1023], [1024, 7, 3000], [4095, 4096, 10**7], []):
        pos = torch.tensor(positions, dtype=torch.int64)
        got, want = table(inv, pos), rope_cos_sin(inv, pos)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert table.size == 4096


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"model_type": "gpt2"}, "model_type 'gpt2' is not a family"),
        ({"rope_scaling": {"rope_type": "dynamic", "factor": 2.0}}, "rope scaling 'dynamic' is not supported"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "rope scaling 'yarn' is not supported"),
        ({"rope_scaling": {"rope_type": "llama3"}}, "needs a 'factor'"),
        ({"hidden_act": "gelu"}, "hidden_act 'gelu'"),
        ({"mlp_bias": True}, "mlp_bias=True"),
        ({"partial_rotary_factor": 0.5}, "partial_rotary_factor"),
        ({"model_type": "qwen2", "use_sliding_window": True}, "sliding-window layers"),
        ({"model_type": "qwen3", "layer_types": ["full_attention", "sliding_attention"]}, "sliding-window layers"),
    ],
)
def test_an_option_the_runner_cannot_honour_is_refused_by_name(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ModelConfig.from_hf(_config(**changes))


def test_a_sliding_window_model_refuses_a_longer_kv_window() -> None:
    config = ModelConfig.from_hf(_config(model_type="mistral", sliding_window=16))
    assert config.sliding_window == 16
    model = LlamaModel(config)
    for policy in (KVPolicy.full(), KVPolicy.windowed(17, sinks=0)):
        with pytest.raises(ValueError, match="attends to its last 16 tokens only"):
            EngineCore(model, policy=policy, num_blocks=64, block_size=4, kernels="torch")
    EngineCore(model, policy=KVPolicy.windowed(16, sinks=4), num_blocks=64, block_size=4, kernels="torch")


def test_the_family_table_covers_every_family_served() -> None:
    served = {cls.model_type for cls, _ in FAMILY_CONFIGS.values()}
    assert served == {"llama", "mistral", "qwen2", "qwen3"}
