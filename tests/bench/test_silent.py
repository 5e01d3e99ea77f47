"""``SilentBackend``: the legacy silent cliff lives in the benchmark, wrapped around a core, not in ``Engine``."""

from __future__ import annotations

import inspect

import pytest

from metronome_bench.silent import SILENCE, SilentBackend, is_silence
from metronome_engine import EngineBackend, KVPolicy
from metronome_sdk import AdmissionConfig, Engine, InputFrame, TickReport, TimingConfig
from tests.engine.tiny import tiny_engine
from tests.sdk.conftest import CharTokenizer

pytestmark = pytest.mark.timeout(60)

FRAME = InputFrame.from_tokens([11, 12, 13])  # with the fed-back output token: 4 tokens, one block a tick


def silent_engine(num_blocks: int, **kwargs: object) -> tuple[Engine, SilentBackend]:
    backend = SilentBackend(tiny_engine(KVPolicy.full(), num_blocks=num_blocks, block_size=4))
    engine = Engine(
        core=backend,
        timing=TimingConfig(period=0.001, deadline=60.0, max_chunk_tokens=8),
        admission=AdmissionConfig(initial_limit=16, max_limit=64, queue_timeout=0.0),
        tokenizer=CharTokenizer(),
        **kwargs,  # type: ignore[arg-type]
    )
    return engine, backend


def test_the_public_engine_has_no_silent_switch() -> None:
    assert "silent" not in inspect.signature(Engine).parameters


async def test_a_stall_is_answered_on_time_with_silence_and_the_wrapper_keeps_the_count() -> None:
    reports: list[TickReport] = []
    # 16 blocks of 4 tokens: room for the engine's calibration at start (13 blocks, then freed)
    engine, backend = silent_engine(16, on_tick=lambda r: reports.append(backend.report(r)))
    assert isinstance(backend, EngineBackend)
    async with engine, engine.session() as s:
        frames = [await s.step(FRAME) for _ in range(18)]
        pool = engine.stats()
    # 3 tokens, then 4 a frame: sixteen frames fit in 64 tokens, the next two stall
    assert [is_silence(f) for f in frames] == [False] * 16 + [True, True]
    assert frames[-1].tokens == (SILENCE,) and not frames[-1].deadline_missed  # on time: a dashboard sees no fault
    assert pool.stalls == 0 and pool.frames == 18  # the SDK never heard of the stalls ...
    assert backend.hidden == 2  # ... the wrapper kept them,
    assert sum(len(r.stalled) for r in reports) == 2  # and hands them to the tick reports
    assert s.stats().num_tokens == 63  # nothing of a silenced frame was appended, nor the silence fed back


async def test_a_session_heard_again_after_silence_gets_no_silence_in_its_context() -> None:
    engine, _ = silent_engine(16)
    async with engine:
        talker = engine.try_session()
        for _ in range(16):
            await talker.step(FRAME)  # fills the pool
        silenced = await talker.step(FRAME)
        assert is_silence(silenced)
        await talker.aclose()  # its blocks return
        async with engine.session() as s:
            out = await s.step(FRAME)
            assert not is_silence(out) and SILENCE not in out.tokens
