"""``Session.mark`` / ``rewind`` / ``keep``: tentative tokens taken back exactly."""

from __future__ import annotations

import anyio
import pytest

from metronome_engine import KVPolicy
from metronome_sdk import (
    ContextMark,
    Engine,
    EngineClosed,
    InputFrame,
    RewindUnavailable,
    Session,
    TimingConfig,
    TurnInterrupted,
)
from tests.sdk.conftest import CharTokenizer, make_engine
from tests.sdk.slowed import SlowedBackend

pytestmark = pytest.mark.timeout(60)

PROMPT = "be brief"


def _engine(window: int = 12) -> Engine:
    timing = TimingConfig(period=0.001, deadline=60.0, max_chunk_tokens=8)
    return make_engine(KVPolicy.windowed(window, sinks=4), num_blocks=128, timing=timing)


async def _reply(s: object, turn: str, frames: int = 4) -> list[tuple[int, ...]]:
    await s.append(turn)  # type: ignore[attr-defined]
    return [(await s.step()).tokens for _ in range(frames)]  # type: ignore[attr-defined]


async def test_a_rewound_turn_leaves_the_context_as_if_it_had_never_been() -> None:
    # the tentative turn and its answer (30 tokens) pass the 12-token window: without the hold the
    # window would drop what the mark saw, and the answer after the rewind would differ
    engine = _engine()
    async with engine:
        async with engine.session(PROMPT) as plain:
            first = await _reply(plain, "hello there")
            then = await _reply(plain, "what now", 6)
            plain_stats = plain.stats()
        async with engine.session(PROMPT, rewind_tokens=64) as s:
            assert await _reply(s, "hello there") == first
            mark = await s.mark()
            before = s.stats()
            await _reply(s, "a question the caller did not finish", 4)
            assert s.stats().num_tokens > mark.num_tokens + 12
            assert s.stats().evicted_tokens > before.evicted_tokens  # what the model saw moved on
            await s.rewind(mark)
            back = s.stats()
            assert (back.num_tokens, back.turns, back.evicted_tokens) == (
                before.num_tokens,
                before.turns,
                before.evicted_tokens,
            )
            assert await _reply(s, "what now", 6) == then  # the same answer, token for token
            stats = s.stats()
    assert (stats.num_tokens, stats.turns, stats.evicted_tokens) == (
        plain_stats.num_tokens,
        plain_stats.turns,
        plain_stats.evicted_tokens,
    )
    pool = engine.stats()
    assert pool.used_blocks == 0  # nothing leaked from the pool


async def test_kept_tokens_stay_and_the_window_moves_on() -> None:
    engine = _engine()
    async with engine, engine.session(PROMPT, rewind_tokens=64) as s:
        await _reply(s, "hello there")
        mark = await s.mark()
        await _reply(s, "the whole question", 4)
        held = s.stats().num_blocks
        await s.keep(mark)
        await s.step()  # the next step evicts what the hold kept
        assert s.stats().num_blocks < held
        with pytest.raises(RewindUnavailable):
            await s.rewind(mark)  # kept: there is no going back


async def test_past_rewind_tokens_the_rewind_is_refused_and_nothing_changes() -> None:
    engine = _engine()
    async with engine, engine.session(PROMPT, rewind_tokens=8) as s:
        await _reply(s, "hello there")
        mark = await s.mark()
        await _reply(s, "a turn longer than eight tokens", 2)
        tokens = s.stats().num_tokens
        with pytest.raises(RewindUnavailable) as caught:
            await s.rewind(mark)
        assert caught.value.tokens_since == tokens - mark.num_tokens > 8
        assert s.stats().num_tokens == tokens
        await s.step()  # the session goes on


async def test_a_mark_needs_rewind_tokens_and_a_quiet_session() -> None:
    engine = _engine()
    async with engine:
        async with engine.session(PROMPT) as s:
            await s.step("hi")
            with pytest.raises(ValueError, match="rewind_tokens"):
                await s.mark()
        async with engine.session(PROMPT, rewind_tokens=16) as s:
            await s.step("hi")
            s.send_nowait(None)
            with pytest.raises(ValueError, match="queued"):
                await s.mark()
            await s.receive()
            mark = await s.mark()
            s.send_nowait(None)
            with pytest.raises(ValueError, match="interrupt"):
                await s.rewind(mark)
            await s.receive()
            await s.rewind(mark)
    with pytest.raises(ValueError, match="rewind_tokens"):
        engine.session(rewind_tokens=-1)


async def test_a_mark_before_the_first_step_goes_back_to_no_sequence() -> None:
    engine = _engine()
    async with engine:
        async with engine.session(PROMPT) as plain:
            want = [(await plain.step("hi")).tokens]
        async with engine.session(PROMPT, rewind_tokens=64) as s:
            mark = await s.mark()
            await s.step("something else")
            await s.rewind(mark)
            assert s.stats().num_tokens == 0
            assert [(await s.step("hi")).tokens] == want


async def test_a_rewind_waits_for_the_interrupted_frame_in_the_tick_now_running() -> None:
    # a voice agent's answer ahead, withdrawn while its frame is being stepped: the frame leaves with
    # that tick (its output dropped), and the rewind waits for it instead of refusing
    core = SlowedBackend(KVPolicy.windowed(12, sinks=4), fixed=0.15, per_token=0.0)
    engine = Engine(core=core, timing=TimingConfig(period=0.01, deadline=60.0), tokenizer=CharTokenizer())
    async with engine, engine.session(PROMPT, rewind_tokens=64) as s:
        await s.step(InputFrame.from_tokens([5, 6]))
        mark = await s.mark()
        before = s.stats()
        served = len(core.steps)
        s.send_nowait(InputFrame.from_tokens([7, 8, 9]))
        with anyio.fail_after(10):
            while len(core.steps) == served:  # the step that takes it has begun (it records, then works)
                await anyio.sleep(0.001)
        assert core.steps[-1] >= 3
        s.interrupt()
        with pytest.raises(TurnInterrupted):
            s.receive_nowait()  # the frame's answer: interrupted
        await s.rewind(mark)  # no ValueError: the frame in the tick was waited for
        back = s.stats()
        assert (back.num_tokens, back.turns) == (before.num_tokens, before.turns)
        assert s.receive_nowait() is None  # its output was dropped, never delivered
        await s.step(InputFrame.from_tokens([7]))  # and the session goes on


async def _close_while_rewinding(engine: Engine, s: Session, mark: ContextMark, *, within: float) -> None:
    """Close ``engine`` while ``s`` rewinds to ``mark``: the rewind ends with EngineClosed within ``within`` s."""
    ended: list[EngineClosed] = []

    async def rewind() -> None:
        with pytest.raises(EngineClosed) as caught:
            await s.rewind(mark)
        ended.append(caught.value)

    with anyio.fail_after(within):
        async with anyio.create_task_group() as tg:
            tg.start_soon(rewind)
            await anyio.wait_all_tasks_blocked()
            await engine.aclose()
    assert len(ended) == 1 and ended[0].session_id == s.id


async def test_a_rewind_waiting_on_a_tick_ends_when_the_engine_closes() -> None:
    # the engine is closed while the frame's step runs: the waiting rewind ends with the session
    # (EngineClosed), and neither waits for ticks that will never come nor reports a rewind it did not do
    core = SlowedBackend(KVPolicy.windowed(12, sinks=4), fixed=0.5, per_token=0.0)
    engine = Engine(core=core, timing=TimingConfig(period=0.01, deadline=60.0), tokenizer=CharTokenizer())
    async with engine:
        s = engine.try_session(PROMPT, rewind_tokens=64)
        await s.step(InputFrame.from_tokens([5, 6]))
        mark = await s.mark()
        served = len(core.steps)
        s.send_nowait(InputFrame.from_tokens([7, 8, 9]))
        with anyio.fail_after(10):
            while len(core.steps) == served:  # the step that takes it has begun
                await anyio.sleep(0.001)
        s.interrupt()
        await _close_while_rewinding(engine, s, mark, within=10)


async def test_a_rewind_waiting_on_a_partly_appended_frame_ends_when_the_engine_closes_between_ticks() -> None:
    # 4 of the frame's 12 tokens are in, the rest wait for ticks half a second apart; the engine is
    # closed between two ticks, so no tick ends again: the rewind must still end, with EngineClosed
    core = SlowedBackend(KVPolicy.windowed(12, sinks=4), fixed=0.0, per_token=0.0)
    timing = TimingConfig(period=0.5, deadline=60.0, max_chunk_tokens=4, tick_tokens=4)
    engine = Engine(core=core, timing=timing, tokenizer=CharTokenizer())
    async with engine:
        s = engine.try_session(PROMPT, rewind_tokens=64)
        await s.step(InputFrame.from_tokens([5, 6]))
        mark = await s.mark()
        served = len(core.steps)
        s.send_nowait(InputFrame.from_tokens(list(range(7, 19))))
        with anyio.fail_after(10):
            while len(core.steps) == served:  # the tick that appends its first 4 tokens has run
                await anyio.sleep(0.001)
        s.interrupt()  # too late for this frame: its first tokens are in
        await _close_while_rewinding(engine, s, mark, within=2)
