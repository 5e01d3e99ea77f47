"""What an operator sees: deadline misses, t_sat, Prometheus metrics and structlog events."""

from __future__ import annotations

import urllib.request
from typing import Any

import anyio
import pytest
from structlog.testing import capture_logs

from metronome_engine import KVPolicy
from metronome_sdk import AdmissionRejected, DeadlineMissed, EngineStalled, InputFrame, TimingConfig
from tests.sdk.conftest import FakeClock, make_engine

pytestmark = pytest.mark.timeout(60)

FRAME = InputFrame.from_tokens([31, 32, 33])


class SteppingClock(FakeClock):
    """Every reading is a second later than the last: every frame takes at least a second."""

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


@pytest.mark.parametrize(("clock", "late"), [(SteppingClock(), True), (FakeClock(), False)])
async def test_deadline_misses_are_counted_per_session_and_in_total(clock: FakeClock, late: bool) -> None:
    timing = TimingConfig(period=0.001, deadline=0.5)
    async with make_engine(timing=timing, clock=clock) as engine, engine.session() as s:
        outs = [await s.step(FRAME) for _ in range(3)]
        assert [o.deadline_missed for o in outs] == [late] * 3
        assert all((o.latency > 0.5) == late for o in outs)
        assert s.stats().deadline_misses == (3 if late else 0)
        assert engine.stats().deadline_misses == (3 if late else 0)


async def test_strict_timing_raises_deadline_missed_with_the_late_frame() -> None:
    timing = TimingConfig(period=0.001, deadline=0.5, strict=True)
    async with make_engine(timing=timing, clock=SteppingClock()) as engine, engine.session() as s:
        with pytest.raises(TimeoutError) as info:
            await s.step(FRAME)
        err = info.value
        assert isinstance(err, DeadlineMissed)
        assert err.session_id == s.id
        assert err.latency > err.deadline == 0.5
        assert err.output is not None and err.output.tokens  # the late data is not lost


async def test_stats_predict_saturation_from_measured_growth() -> None:
    clock = FakeClock()
    engine = make_engine(KVPolicy.full(), num_blocks=64, clock=clock)
    async with engine, engine.session() as s:
        for _ in range(6):
            clock.advance(1.0)
            await s.step(FRAME)  # 4 tokens: one block a tick, a tick a second
        stats = engine.stats()
        assert stats.growth_rate == pytest.approx(1.0)  # r: blocks per second per session
        assert stats.used_blocks == 6
        assert stats.occupancy == pytest.approx(6 / 64)
        assert stats.t_sat == pytest.approx((64 - 6) / (1 * 1.0))  # 58 free blocks at one block a second
        assert stats.latency_p50 == 0.0 and stats.latency_p99 == 0.0
        assert (stats.frames, stats.ticks, stats.sessions) == (6, 6, 1)
    assert engine.stats().t_sat is None  # no sessions: nothing fills the pool


async def test_each_tick_report_carries_the_gauge_stats_shows() -> None:
    clock, reports = FakeClock(), []
    engine = make_engine(KVPolicy.full(), num_blocks=64, clock=clock, on_tick=reports.append)
    async with engine, engine.session() as s:
        for _ in range(5):
            clock.advance(1.0)
            await s.step(FRAME)
            last, stats = reports[-1], engine.stats()
            assert (last.t_sat, last.growth_rate) == (stats.t_sat, stats.growth_rate)
        assert [r.grown_blocks for r in reports] == [1] * 5  # one block a tick, as counted into r
        assert reports[-1].t_sat == pytest.approx((64 - 5) / 1.0)


async def test_the_growth_window_is_the_engines_to_set() -> None:
    clock = FakeClock()
    timing = TimingConfig(period=0.001, deadline=60.0, max_chunk_tokens=8, growth_window=2.0)
    engine = make_engine(KVPolicy.full(), num_blocks=64, clock=clock, timing=timing)
    async with engine, engine.session() as s:
        for step in range(8):
            clock.advance(1.0)
            # 4 tokens a tick (one block) for 4 ticks, then 1 token a tick (a block every 4 ticks)
            await s.step(FRAME if step < 4 else InputFrame.empty())
        # the last 2 s saw at most one block: a 5 s window would still see the fast ticks
        assert engine.stats().growth_rate <= 0.5


async def test_prometheus_metrics_render_and_serve() -> None:
    async with make_engine(limit=3) as engine, engine.session() as s:
        for _ in range(3):
            await s.step(FRAME)
        text = engine.metrics.text().decode()
        assert "metronome_frames_total 3.0" in text
        assert "metronome_frame_latency_seconds_count 3.0" in text
        assert "metronome_sessions 1.0" in text
        assert "metronome_admission_limit 3.0" in text
        assert "metronome_pool_occupancy" in text and "metronome_t_sat_seconds" in text

        port = engine.metrics.serve(0)
        url = f"http://127.0.0.1:{port}/metrics"
        body = await anyio.to_thread.run_sync(lambda: urllib.request.urlopen(url, timeout=10).read())
        assert b"metronome_frames_total 3.0" in body
    with pytest.raises(OSError):  # closing the engine stops the endpoint
        await anyio.to_thread.run_sync(lambda: urllib.request.urlopen(url, timeout=10).read())


async def test_logs_show_admission_stall_and_close_events() -> None:
    engine = make_engine(KVPolicy.full(), num_blocks=4, limit=2)
    with capture_logs() as logs:
        async with engine, engine.session() as hog, engine.session() as s:
            with pytest.raises(AdmissionRejected):
                engine.try_session()
            await hog.step(InputFrame.from_tokens([3] * 7))  # two of the four blocks
            await s.step(InputFrame.from_tokens([3] * 7))  # the other two
            with pytest.raises(EngineStalled):
                await s.step(InputFrame.from_tokens([3] * 7))
    events = [e for e in logs if e["event"] != "engine.started"]
    by_name: dict[str, list[Any]] = {}
    for e in events:
        by_name.setdefault(str(e["event"]), []).append(e)
    assert [e["session_id"] for e in by_name["admission.admitted"]] == [hog.id, s.id]
    (rejected,) = by_name["admission.rejected"]
    assert (rejected["limit"], rejected["in_flight"], rejected["log_level"]) == (2, 2, "warning")
    (stalled,) = by_name["session.stalled"]
    assert (stalled["session_id"], stalled["reason"], stalled["log_level"]) == (s.id, "pool_exhausted", "warning")
    closed = {e["session_id"]: e for e in by_name["session.closed"]}
    assert closed[s.id]["stalls"] == 1 and closed[hog.id]["stalls"] == 0
    assert closed[s.id]["by"] == "application"


def test_the_library_does_not_configure_logging() -> None:
    import logging

    import metronome_sdk  # noqa: F401

    handlers = logging.getLogger("metronome_sdk").handlers
    assert [type(h) for h in handlers] == [logging.NullHandler]
    assert not logging.getLogger().handlers or all(
        type(h).__module__.startswith("_pytest") for h in logging.getLogger().handlers
    )


async def test_bounded_sessions_predict_no_saturation() -> None:
    clock = FakeClock()
    engine = make_engine(KVPolicy.windowed(8, sinks=4), num_blocks=64, clock=clock)
    async with engine, engine.session() as s:
        for _ in range(6):
            clock.advance(1.0)
            await s.step(FRAME)
        stats = engine.stats()
        assert stats.growth_rate > 0  # the window is still filling ...
        assert stats.t_sat is None  # ... but the guard keeps the pool from ever filling
