"""A tiny random Llama (or another family's model) in HF transformers and the same
weights in our runner."""

from __future__ import annotations

from typing import Any

import torch
from transformers import (
    AutoModelForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    PretrainedConfig,
    PreTrainedModel,
    Qwen2Config,
    Qwen3Config,
)

from metronome_engine import EngineCore, KVPolicy, ModelConfig, StepRequest
from metronome_engine.engine import Kernels
from metronome_engine.model import LlamaModel

VOCAB = 97


def tiny_hf(seed: int = 0, *, tie: bool = True) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    cfg = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        rope_theta=10000.0,
        tie_word_embeddings=tie,
    )
    model = LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():  # larger weights: sharper attention, a stricter test
            p.mul_(4.0)
    return model


_SHAPE: dict[str, Any] = {
    "vocab_size": VOCAB,
    "hidden_size": 64,
    "intermediate_size": 96,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "max_position_embeddings": 256,
}
# a short original context, so that llama3's three bands (kept, scaled, blended) all hold
# some of head_dim 16's eight frequencies
_LLAMA3 = {
    "rope_type": "llama3",
    "factor": 8.0,
    "low_freq_factor": 1.0,
    "high_freq_factor": 4.0,
    "original_max_position_embeddings": 64,
}

# each family's options, as its real configs set them (Llama 3.1/3.2: llama3 RoPE; Qwen2:
# q/k/v bias; Qwen3: q/k norm; ...), on the same tiny shape
FAMILY_CONFIGS: dict[str, tuple[type[PretrainedConfig], dict[str, Any]]] = {
    "llama-untied": (LlamaConfig, {"tie_word_embeddings": False}),
    "llama3": (LlamaConfig, {"rope_scaling": _LLAMA3, "rope_theta": 500000.0, "tie_word_embeddings": False}),
    "llama-linear-rope": (LlamaConfig, {"rope_scaling": {"rope_type": "linear", "factor": 4.0}}),
    "llama-attention-bias": (LlamaConfig, {"attention_bias": True, "tie_word_embeddings": False}),
    "qwen2": (Qwen2Config, {"rope_theta": 1000000.0, "tie_word_embeddings": True}),
    "qwen3": (Qwen3Config, {"rope_theta": 1000000.0, "tie_word_embeddings": True}),
    "qwen3-untied-bias": (Qwen3Config, {"attention_bias": True, "tie_word_embeddings": False}),
    "mistral": (MistralConfig, {"sliding_window": None, "tie_word_embeddings": False}),
}


def tiny_family(family: str, seed: int = 0, **shape: Any) -> PreTrainedModel:
    """A tiny random model of ``family`` (a key of ``FAMILY_CONFIGS``): larger weights than
    HF's initialisation, random biases and q/k norm weights, so that every option matters."""
    cls, options = FAMILY_CONFIGS[family]
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cls(**(_SHAPE | shape), **options)).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_(0.0, 1.0)
            elif name.endswith(("q_norm.weight", "k_norm.weight")):
                p.uniform_(0.5, 2.0)
            else:
                p.mul_(4.0)
    return model


def tiny_runner(hf: PreTrainedModel) -> LlamaModel:
    model = LlamaModel(ModelConfig.from_hf(hf.config.to_dict()))
    model.load_hf_state_dict(hf.state_dict())
    return model


def tiny_engine(
    policy: KVPolicy, *, num_blocks: int = 256, block_size: int = 4, seed: int = 0, kernels: Kernels = "auto"
) -> EngineCore:
    return EngineCore(
        tiny_runner(tiny_hf(seed)), policy=policy, num_blocks=num_blocks, block_size=block_size, kernels=kernels
    )


class FaultyHead(LlamaModel):
    """A model whose head goes wrong as a bad kernel or a bit flip would, after the forward pass
    has written the step's K/V: once ``fault`` is ``(row, column, value)``, that logit of every
    step comes out as ``value``; once ``error`` is set, the head raises it."""

    fault: tuple[int, int, float] | None = None
    error: BaseException | None = None

    @torch.inference_mode()
    def logits(self, hidden: torch.Tensor, ops: Any = None) -> torch.Tensor:
        if self.error is not None:
            raise self.error
        out = super().logits(hidden, ops)
        if self.fault is None:
            return out
        row, column, value = self.fault
        out = out.clone()
        out[row, column] = value
        return out


def faulty_engine(
    policy: KVPolicy, *, num_blocks: int = 256, block_size: int = 4, kernels: Kernels = "auto"
) -> tuple[EngineCore, FaultyHead]:
    """``tiny_engine``'s engine on a ``FaultyHead`` of the same weights, and that model."""
    hf = tiny_hf(0)
    model = FaultyHead(ModelConfig.from_hf(hf.config.to_dict()))
    model.load_hf_state_dict(hf.state_dict())
    return EngineCore(model, policy=policy, num_blocks=num_blocks, block_size=block_size, kernels=kernels), model


def scripted_logits(engine: EngineCore, seed: int = 4) -> torch.Tensor:
    """Every logit row of three sessions through 18 steps of mixed prefill chunks and
    decodes (random tokens, ``seed``): what two engines on the same weights must agree on."""
    steps = [[9, 1, 17], [1, 1, 1], [5, 1, 2]] * 6
    seqs = [engine.add_sequence() for _ in range(3)]
    gen = torch.Generator().manual_seed(seed)
    rows = []
    for sizes in steps:
        reqs = [
            StepRequest(s, torch.randint(0, VOCAB, (n,), generator=gen).tolist(), all_logits=True)
            for s, n in zip(seqs, sizes, strict=True)
        ]
        for out in engine.step(reqs):
            assert out.logits is not None
            rows.append(out.logits)
    return torch.cat(rows)
