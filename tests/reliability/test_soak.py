"""Soak: sessions open and close at random for a fixed number of ticks; nothing leaks and the beat holds.

Bounds (stated here and in docs/reliability.md): the pool returns to empty; no thread or
asyncio task outlives the engine; RSS grows by at most ``RSS_BOUND`` from the end of the
warm-up to the end; the median per-frame latency of the second half is within
``LATENCY_RATIO`` of the first half's (a ratio, not a wall-clock threshold).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import statistics
import threading

import pytest

from metronome_engine import KVPolicy
from metronome_sdk import AdmissionConfig, AdmissionRejected, Engine, InputFrame, Session, TimingConfig
from tests.engine.tiny import tiny_engine
from tests.sdk.conftest import CharTokenizer

RSS_BOUND = 64 << 20
LATENCY_RATIO = 4.0


def rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError):
        pass
    try:
        import psutil  # type: ignore[import-untyped]
    except ImportError:
        return None
    return int(psutil.Process().memory_info().rss)


async def soak(ticks: int, max_sessions: int, seed: int) -> None:
    rng = random.Random(seed)
    threads_before = set(threading.enumerate())
    tasks_before = asyncio.all_tasks()
    core = tiny_engine(KVPolicy.windowed(8, sinks=4), num_blocks=max_sessions * 8)
    engine = Engine(
        core=core,
        timing=TimingConfig(period=0.001, deadline=60.0, max_chunk_tokens=8),
        admission=AdmissionConfig(initial_limit=max_sessions, max_limit=max_sessions, queue_timeout=0.0),
        tokenizer=CharTokenizer(),
    )
    latencies: list[float] = []
    rss_warm: int | None = None
    async with engine:
        open_: list[Session] = []
        for tick in range(ticks):
            if rng.random() < 0.3 or not open_:
                with contextlib.suppress(AdmissionRejected):  # at the cap: the soak tries again later
                    open_.append(engine.try_session(system_prompt="be brief" if rng.random() < 0.3 else None))
            if open_ and rng.random() < 0.2:
                await open_.pop(rng.randrange(len(open_))).aclose()
            for s in open_:
                kind = rng.random()
                frame = InputFrame.from_tokens([rng.randrange(3, 90) for _ in range(rng.randint(1, 6))])
                await s.send("hi" if kind < 0.1 else (None if kind < 0.2 and s.stats().frames_sent else frame))
            for s in open_:
                out = await s.receive()
                assert out.tokens
                latencies.append(out.latency)
            if tick == ticks // 3:
                rss_warm = rss_bytes()
        stats = engine.stats()
        assert stats.stalls == 0 and stats.step_failures == 0
        for s in open_:
            await s.aclose()
        assert core.pool_stats().used_blocks == 0 and core.pool_stats().sequences == 0
    rss_end = rss_bytes()
    assert core.pool_stats().used_blocks == 0
    assert set(threading.enumerate()) - threads_before == set()  # the core thread was joined
    assert asyncio.all_tasks() - tasks_before == set()  # the tick loop ended
    if rss_warm is not None and rss_end is not None:
        assert rss_end - rss_warm <= RSS_BOUND, f"RSS grew {(rss_end - rss_warm) >> 20} MiB"
    half = len(latencies) // 2
    first, second = statistics.median(latencies[:half]), statistics.median(latencies[half:])
    assert second <= LATENCY_RATIO * first + 1e-3, (first, second)  # + 1 ms: a floor for a near-zero median


@pytest.mark.timeout(120)
def test_quick_soak_returns_every_block_and_leaks_nothing() -> None:
    asyncio.run(soak(ticks=300, max_sessions=6, seed=7))


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_long_soak_returns_every_block_and_leaks_nothing() -> None:
    asyncio.run(soak(ticks=5000, max_sessions=12, seed=11))
