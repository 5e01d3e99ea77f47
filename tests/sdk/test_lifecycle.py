"""Opening, cancelling and closing: sessions end cleanly and their blocks come back."""

from __future__ import annotations

import anyio
import pytest

from metronome_sdk import EngineClosed, EngineStalled, InputFrame, SessionClosed
from tests.sdk.conftest import make_engine
from tests.support import FaultyBackend

pytestmark = pytest.mark.timeout(60)

FRAME = InputFrame.from_tokens([21, 22, 23])


async def test_cancelled_mid_step_closes_the_session_cleanly() -> None:
    engine = make_engine(faulty=True)
    async with engine:
        core = engine.core
        assert isinstance(core, FaultyBackend)
        held = core.hold()  # the next step hangs until released
        opened: list[int] = []

        async def talk() -> None:
            async with engine.session() as s:
                opened.append(s.id)
                await s.step(FRAME)
                pytest.fail("the step returned although its task was cancelled")

        async with anyio.create_task_group() as tg:
            tg.start_soon(talk)
            await anyio.to_thread.run_sync(held.entered.wait, 10)  # the step is running on the worker
            tg.cancel_scope.cancel()
            held.release.set()

        assert opened
        assert engine.stats().sessions == 0
        assert core.pool_stats().used_blocks == 0
        assert core.pool_stats().sequences == 0
        async with engine.session() as again:  # the engine is still serving
            assert (await again.step(FRAME)).tokens


async def test_closing_the_engine_ends_every_session_with_engine_closed() -> None:
    engine = make_engine()
    async with engine:
        a = engine.try_session()
        b = engine.try_session()
        await a.step(FRAME)
        waiting: list[BaseException] = []

        async def wait_for_output() -> None:
            try:
                await b.receive()
            except EngineClosed as exc:
                waiting.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(wait_for_output)
            await anyio.wait_all_tasks_blocked()
            await engine.aclose()
        assert len(waiting) == 1 and waiting[0].session_id == b.id  # type: ignore[attr-defined]

        for s in (a, b):
            assert s.closed
            with pytest.raises(EngineClosed, match="engine was closed"):
                await s.step(FRAME)
            with pytest.raises(EngineClosed):
                await s.receive()
            with pytest.raises(EngineClosed):
                async for _ in s:
                    pass
        with pytest.raises(EngineClosed):
            engine.try_session()
        with pytest.raises(EngineClosed):
            async with engine.session():
                pass
        assert engine.core.pool_stats().used_blocks == 0
        assert engine.stats().sessions == 0
        await a.aclose()  # closing again is a no-op


async def test_a_closed_session_refuses_use_and_iteration_ends() -> None:
    async with make_engine() as engine:
        async with engine.session() as s:
            await s.send(FRAME)
            await s.send(FRAME)
            received = []
            async for out in s:
                received.append(out.index)
                if len(received) == 2:
                    await s.aclose()
            assert received == [0, 1]
        with pytest.raises(SessionClosed, match="was closed"):
            await s.step(FRAME)


async def test_outputs_come_back_in_order_with_latency_and_tick() -> None:
    async with make_engine() as engine, engine.session() as s:
        for _ in range(3):
            await s.send(FRAME)
        outs = [await s.receive() for _ in range(3)]
        assert [o.index for o in outs] == [0, 1, 2]
        assert [o.tick for o in outs] == sorted({o.tick for o in outs})  # one frame per session per tick
        assert all(o.latency >= 0 and not o.deadline_missed for o in outs)
        assert all(o.session_id == s.id for o in outs)


async def test_a_stalled_session_can_resend_the_frame_it_got_back() -> None:
    from metronome_engine import KVPolicy

    engine = make_engine(KVPolicy.full(), num_blocks=3)
    async with engine:
        hog = engine.try_session()
        s = engine.try_session()
        await hog.step(InputFrame.from_tokens([5] * 8))  # two of three blocks
        await s.step(FRAME)  # the last block
        with pytest.raises(EngineStalled) as info:
            await s.step(InputFrame.from_tokens([5] * 8))
        await hog.aclose()
        assert info.value.frame is not None
        out = await s.step(info.value.frame)
        assert out.tokens
