"""A tiny random Llama in HF transformers and the same weights in our runner."""

from __future__ import annotations

import torch
from transformers import LlamaConfig, LlamaForCausalLM

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


def tiny_runner(hf: LlamaForCausalLM) -> LlamaModel:
    model = LlamaModel(ModelConfig.from_hf(hf.config.to_dict()))
    model.load_hf_state_dict(hf.state_dict())
    return model


def tiny_engine(
    policy: KVPolicy, *, num_blocks: int = 256, block_size: int = 4, seed: int = 0, kernels: Kernels = "auto"
) -> EngineCore:
    return EngineCore(
        tiny_runner(tiny_hf(seed)), policy=policy, num_blocks=num_blocks, block_size=block_size, kernels=kernels
    )


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
