"""GGUF files of the served families load directly: a tiny random model of each family
written as a GGUF file (Q4_1 layers, a Q8_0 embedding, as llama.cpp writes them) equals HF
transformers' reading of the same file, and its blocks feed the fused kernels' tiles."""

from __future__ import annotations

from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as GGML
from transformers import AutoModelForCausalLM

from metronome_engine import EngineCore, KVPolicy, StepRequest
from metronome_engine import kernels as fused_kernels
from metronome_engine.engine import Kernels
from metronome_engine.weights import load_model

from .tiny import VOCAB, tiny_family

_LAYER = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "input_layernorm": "attn_norm",
    "post_attention_layernorm": "ffn_norm",
}


def _llama_cpp_permute(w: np.ndarray, heads: int) -> np.ndarray:
    # llama.cpp's converter interleaves each head's rotary halves for the llama architecture
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def write_gguf(family: str, path: Path, seed: int, *, rope_freqs: bool = False) -> None:
    # transformers reads a qwen3 file's head_dim as 128 (every Qwen3's)
    hf = tiny_family(family, seed=seed, **({"head_dim": 128} if family == "qwen3" else {}))
    c = hf.config
    arch = c.model_type
    out = gguf.GGUFWriter(str(path), arch)
    out.add_context_length(c.max_position_embeddings)
    out.add_embedding_length(c.hidden_size)
    out.add_block_count(c.num_hidden_layers)
    out.add_feed_forward_length(c.intermediate_size)
    out.add_head_count(c.num_attention_heads)
    out.add_head_count_kv(c.num_key_value_heads)
    out.add_key_length(c.head_dim)
    out.add_value_length(c.head_dim)
    out.add_layer_norm_rms_eps(c.rms_norm_eps)
    out.add_rope_freq_base(c.rope_parameters["rope_theta"])
    out.add_vocab_size(c.vocab_size)

    def add(name: str, value: torch.Tensor, kind: GGML) -> None:
        arr = value.detach().numpy().astype(np.float32)
        if kind == GGML.F32:
            out.add_tensor(name, arr)
        else:
            out.add_tensor(name, gguf.quants.quantize(arr, kind), raw_dtype=kind)

    sd = hf.state_dict()
    add("token_embd.weight", sd["model.embed_tokens.weight"], GGML.Q8_0)
    if not c.tie_word_embeddings:
        add("output.weight", sd["lm_head.weight"], GGML.Q8_0)
    add("output_norm.weight", sd["model.norm.weight"], GGML.F32)
    if rope_freqs:  # llama.cpp's form of Llama 3's RoPE scaling: a divisor per frequency
        add("rope_freqs.weight", torch.ones(c.head_dim // 2), GGML.F32)
    for i in range(c.num_hidden_layers):
        for hf_name, gguf_name in _LAYER.items():
            for part in ("weight", "bias"):
                value = sd.get(f"model.layers.{i}.{hf_name}.{part}")
                if value is None:
                    continue
                if arch == "llama" and hf_name in ("self_attn.q_proj", "self_attn.k_proj"):
                    heads = c.num_attention_heads if hf_name.endswith("q_proj") else c.num_key_value_heads
                    value = torch.from_numpy(_llama_cpp_permute(value.numpy(), heads))
                kind = GGML.Q4_1 if value.dim() == 2 else GGML.F32
                add(f"blk.{i}.{gguf_name}.{part}", value, kind)
    out.write_header_to_file()
    out.write_kv_data_to_file()
    out.write_tensors_to_file()
    out.close()


@pytest.mark.usefixtures("cache")
@pytest.mark.parametrize("family", ["llama-untied", "qwen2", "qwen3"])
def test_a_gguf_file_of_each_family_loads_and_equals_hf_reading_it(
    family: str, kernels: Kernels, tmp_path: Path
) -> None:
    path = tmp_path / f"tiny-{family}.gguf"
    write_gguf(family, path, seed=4)
    hf = AutoModelForCausalLM.from_pretrained(str(tmp_path), gguf_file=path.name, dtype=torch.float32)
    model = load_model(path)
    assert model.config.model_type == hf.config.model_type
    engine = EngineCore(model, policy=KVPolicy.windowed(8, sinks=2), num_blocks=32, block_size=4, kernels=kernels)
    if kernels == "fused":
        assert model.tiles == fused_kernels.tiles_available()  # the file's own blocks, exactly
    tokens = torch.randint(0, VOCAB, (8,), generator=torch.Generator().manual_seed(6)).tolist()
    out = engine.step([StepRequest(engine.add_sequence(), tokens, all_logits=True)])[0]
    with torch.no_grad():
        ref = hf(torch.tensor([tokens])).logits[0]  # 8 tokens: the window holds them all
    assert out.logits is not None
    assert float((out.logits - ref).abs().max() / ref.abs().max()) < 1e-4


@pytest.mark.usefixtures("cache")
def test_a_gguf_file_with_llama3_rope_factors_is_refused_by_name(tmp_path: Path) -> None:
    """transformers' GGUF reader drops a Llama 3 file's rope_freqs: its model would be wrong."""
    path = tmp_path / "tiny-llama3.gguf"
    write_gguf("llama3", path, seed=4, rope_freqs=True)
    with pytest.raises(ValueError, match="rope_freqs"):
        load_model(path)
