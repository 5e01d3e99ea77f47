"""The real SmolLM2-135M-Instruct weights through the engine (installed by `make`)."""

from __future__ import annotations

import platform

import pytest
import torch

from metronome_engine import EngineCore, KVPolicy, StepRequest
from metronome_engine import kernels as fused_kernels
from metronome_engine.kernels.choice import REGIMES
from metronome_engine.tokenizer import Tokenizer
from metronome_engine.weights import DEFAULT_MODEL, load_model, resolve_model_dir

pytestmark = pytest.mark.real_model


@pytest.fixture(scope="module")
def model():  # type: ignore[no-untyped-def]
    return load_model(DEFAULT_MODEL)


@pytest.mark.parametrize("layout", ["torch", "float32", "tiles", "x86-64-v3", "groups", "groups-x86-64-v3"])
def test_logits_match_hf_transformers_for_a_batch_of_sessions(layout: str) -> None:
    """The torch path, and the fused kernels on float32 weights (native build), on AMX
    tiles, and in the x86-64-v3 build (float32 weights: what AVX2 machines run); and the
    dense layers read from column groups of the GGUF blocks, in each build."""
    from transformers import LlamaForCausalLM

    model = load_model(DEFAULT_MODEL)  # its own copy: the fused engine packs the weights in place
    isa = "x86-64-v3" if layout.endswith("x86-64-v3") else "native"
    if isa == "x86-64-v3" and platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("the x86-64-v3 build is for x86-64 CPUs")
    if layout == "tiles" and not fused_kernels.get_build("native").tiles_available():
        pytest.skip("this CPU (or OS) offers no AMX tiles")
    if layout in ("float32", "tiles"):
        assert model.pack_weights(fused_kernels.get_build("native"), tiles=layout == "tiles") == (layout == "tiles")
    if layout.startswith("groups"):
        assert model.pack_groups()

    hf = LlamaForCausalLM.from_pretrained(str(resolve_model_dir(DEFAULT_MODEL)), dtype=torch.float32)
    hf.train(False)
    tok = Tokenizer(DEFAULT_MODEL)
    texts = [
        "The quick brown fox jumps over the lazy dog because",
        "In 1905 Albert Einstein published four papers that changed physics: the photoelectric effect,",
        "def fibonacci(n):\n    if n < 2:\n        return n\n",
    ]
    streams = [tok.encode(t) for t in texts]
    engine = EngineCore(
        model, policy=KVPolicy.full(), num_blocks=64, kernels="torch" if layout == "torch" else "fused", isa=isa
    )
    if layout.startswith("groups"):
        engine.pin_paths(dict.fromkeys(REGIMES, "groups"))
        assert not model.packed
    seqs = [engine.add_sequence() for _ in streams]
    # chunked prefill of all but the last 3 tokens, then 3 decode steps
    outs = engine.step([StepRequest(s, t[:-3], all_logits=True) for s, t in zip(seqs, streams, strict=True)])
    with torch.no_grad():
        for out, t in zip(outs, streams, strict=True):
            ref = hf(torch.tensor([t[:-3]])).logits[0]
            assert out.logits is not None
            assert float((out.logits - ref).abs().max() / ref.abs().max()) < 1e-4
        for k in (3, 2, 1):
            outs = engine.step(
                [StepRequest(s, [t[-k]], return_logits=True) for s, t in zip(seqs, streams, strict=True)]
            )
            for out, t in zip(outs, streams, strict=True):
                ref = hf(torch.tensor([t[: len(t) - k + 1]])).logits[0, -1]
                assert out.logits is not None
                assert float((out.logits - ref).abs().max() / ref.abs().max()) < 1e-4


def test_chat_answer_through_the_windowed_engine(model) -> None:  # type: ignore[no-untyped-def]
    tok = Tokenizer(DEFAULT_MODEL)
    engine = EngineCore(model, policy=KVPolicy.windowed(256, sinks=4), num_blocks=64)
    seq = engine.add_sequence()
    nxt = tok.chat([{"role": "user", "content": "What is the capital of France?"}])
    answer: list[int] = []
    for _ in range(20):
        out = engine.step([StepRequest(seq, nxt)])[0]
        assert out.token is not None
        if out.token in tok.stop_ids:
            break
        answer.append(out.token)
        nxt = [out.token]
    assert "Paris" in tok.decode(answer)
