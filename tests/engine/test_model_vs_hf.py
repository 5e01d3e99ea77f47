"""Under the full policy our paged runner computes what HF transformers computes."""

from __future__ import annotations

import pytest
import torch

from metronome_engine import EngineCore, KVPolicy, StepRequest
from metronome_engine.engine import Kernels

from .tiny import FAMILY_CONFIGS, VOCAB, PreTrainedModel, tiny_family, tiny_hf, tiny_runner


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max())


def test_chunked_prefill_then_decode_matches_hf(kernels: Kernels) -> None:
    _check_prefill_then_decode(tiny_hf(1, tie=False), kernels)


@pytest.mark.parametrize("family", sorted(FAMILY_CONFIGS))
def test_each_family_matches_hf_after_chunked_prefill_and_decode(family: str, kernels: Kernels) -> None:
    """Llama 3's scaled RoPE, linear RoPE, attention biases, Qwen2's q/k/v bias, Qwen3's q/k
    norm, untied heads, Mistral: HF transformers' own model classes on the same weights."""
    hf = tiny_family(family, seed=1)
    assert type(hf).__name__.lower().startswith(FAMILY_CONFIGS[family][0].model_type)
    _check_prefill_then_decode(hf, kernels)


def _check_prefill_then_decode(hf: PreTrainedModel, kernels: Kernels) -> None:
    engine = EngineCore(tiny_runner(hf), policy=KVPolicy.full(), num_blocks=64, block_size=4, kernels=kernels)
    gen = torch.Generator().manual_seed(7)
    streams = [torch.randint(0, VOCAB, (40,), generator=gen).tolist() for _ in range(4)]
    prefill = [1, 5, 9, 13]  # different lengths, block-aligned and not
    seqs = [engine.add_sequence() for _ in streams]
    outs = engine.step([StepRequest(s, t[:n], all_logits=True) for s, t, n in zip(seqs, streams, prefill, strict=True)])
    with torch.no_grad():
        for out, t, n in zip(outs, streams, prefill, strict=True):
            assert out.logits is not None and out.logits.shape == (n, VOCAB)
            assert rel_err(out.logits, hf(torch.tensor([t[:n]])).logits[0]) < 1e-4
        cur = list(prefill)
        for chunk in (1, 3, 1, 2):  # decode steps and small chunks, mixed
            outs = engine.step(
                [
                    StepRequest(s, t[c : c + chunk], return_logits=True)
                    for s, t, c in zip(seqs, streams, cur, strict=True)
                ]
            )
            cur = [c + chunk for c in cur]
            for out, t, c in zip(outs, streams, cur, strict=True):
                assert out.logits is not None
                assert rel_err(out.logits, hf(torch.tensor([t[:c]])).logits[0, -1]) < 1e-4
                assert out.num_tokens == c


def test_greedy_generation_matches_hf_generate(kernels: Kernels) -> None:
    hf = tiny_hf(2)
    engine = EngineCore(tiny_runner(hf), policy=KVPolicy.full(), num_blocks=64, block_size=4, kernels=kernels)
    prompt = [3, 14, 15, 92, 65, 35]
    seq = engine.add_sequence()
    out = engine.step([StepRequest(seq, prompt)])[0]
    ours = [out.token]
    for _ in range(11):
        assert ours[-1] is not None
        ours.append(engine.step([StepRequest(seq, [ours[-1]])])[0].token)
    hf.generation_config.eos_token_id = None  # generate all 12 tokens, as the engine does
    with torch.no_grad():
        ref = hf.generate(torch.tensor([prompt]), max_new_tokens=12, do_sample=False, pad_token_id=0)
    assert ours == ref[0, len(prompt) :].tolist()
