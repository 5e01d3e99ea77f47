"""``Session.append``: a user's turn goes into the context ahead of the frame that answers it."""

from __future__ import annotations

import anyio
import pytest

from metronome_engine import KVPolicy
from metronome_sdk import Engine, InputFrame, SessionClosed, TickReport, TimingConfig
from tests.sdk.conftest import make_engine

pytestmark = pytest.mark.timeout(60)

PROMPT = "be brief"


def timing(**kw: object) -> TimingConfig:
    return TimingConfig(period=0.001, deadline=60.0, max_chunk_tokens=8, **kw)  # type: ignore[arg-type]


async def _conversation(
    engine: Engine, reports: list[TickReport], ahead: bool
) -> tuple[list[tuple[int, ...]], list[TickReport], int, int]:
    """Two turns, each answered over four frames; with ``ahead`` the turns go in by append()."""
    before = len(reports)
    outs = []
    async with engine.session(PROMPT) as s:
        for turn in ("what is up", "and then"):
            if ahead:
                await s.append(turn)
                outs.append(await s.step())
            else:
                outs.append(await s.step(turn))
            outs += [await s.step() for _ in range(3)]
        stats = s.stats()
        mine = reports[before:]
        assert stats.num_tokens == sum(r.tokens for r in mine)  # every token appended once
        return [o.tokens for o in outs], mine, stats.turns, stats.frames


@pytest.mark.parametrize("at_open", [False, True])
async def test_a_turn_appended_ahead_gets_the_same_reply_as_the_turn_sent_as_a_frame(at_open: bool) -> None:
    # one engine for both, one session at a time: the same kernels, so the same numbers
    reports: list[TickReport] = []
    engine = make_engine(KVPolicy.full(), num_blocks=128, timing=timing(prompt_at_open=at_open), on_tick=reports.append)
    async with engine:
        sent, sent_ticks, sent_turns, sent_frames = await _conversation(engine, reports, False)
        ahead, ahead_ticks, ahead_turns, ahead_frames = await _conversation(engine, reports, True)
    assert ahead == sent  # the same context, token for token (the last reply fed back before the turn)
    assert ahead_turns == sent_turns == 2
    assert ahead_frames == sent_frames == 8
    # every frame of the appended turns appends one token (the turn's last, or its own reply's):
    # the turns' other tokens went in ticks without a frame
    framed = [r.tokens for r in ahead_ticks if r.latencies]
    assert framed == [1] * 8, framed
    assert max(r.tokens for r in sent_ticks if r.latencies) > 1


@pytest.mark.parametrize("alone", [False, True])
async def test_the_turn_goes_in_within_the_tick_budget_while_another_session_may_send(alone: bool) -> None:
    reports: list[TickReport] = []
    engine = make_engine(KVPolicy.full(), num_blocks=128, timing=timing(tick_tokens=3), on_tick=reports.append)
    async with engine, engine.session() as s, engine.session() as other:
        if alone:
            await other.aclose()
        n = await s.append("a question of many tokens")
        assert s.stats().frames_sent == 0
        # beside a session that may send on the beat, within the budget; alone, in whole chunks
        assert max(r.tokens for r in reports) == (8 if alone else 3)
        assert sum(r.tokens for r in reports) == n - 1  # all but the last, which goes with the next frame
        out = await s.step()
        assert out.tokens and s.stats().num_tokens == n + (len(out.tokens) - 1)


async def test_append_while_frames_are_queued_is_refused_and_queues_nothing() -> None:
    async with make_engine(timing=timing()) as engine, engine.session() as s:
        s.send_nowait("hi")
        with pytest.raises(ValueError, match="frames queued"):
            s.append_nowait("more")
        with pytest.raises(ValueError, match="not empty"):
            await s.receive()
            s.append_nowait("")
        with pytest.raises(ValueError, match="str"):
            s.append_nowait(InputFrame.from_text("hi"))  # type: ignore[arg-type]
        assert s.stats().turns == 1


async def test_append_on_a_closed_session_raises_session_closed() -> None:
    async with make_engine(timing=timing()) as engine:
        async with engine.session() as s:
            pass
        with pytest.raises(SessionClosed):
            await s.append("hi")


async def test_a_session_closed_while_its_turn_goes_in_leaves_no_blocks() -> None:
    engine = make_engine(KVPolicy.full(), num_blocks=128, timing=timing(tick_tokens=2))
    async with engine:
        for _ in range(5):
            async with engine.session() as s:
                s.append_nowait("a long enough turn to take ticks")
                await anyio.sleep(0)
        with anyio.fail_after(10):
            while engine.stats().used_blocks:
                await anyio.sleep(0.005)
        assert engine.stats().sessions == 0


async def test_a_turn_ahead_keeps_no_beat_while_every_session_has_context_to_append() -> None:
    # a minute's period: were the turn's ticks paced, or did they move the metronome's phase,
    # the turn or the frame after it would wait a minute
    reports: list[TickReport] = []
    minute = TimingConfig(period=60.0, deadline=60.0, max_chunk_tokens=8, tick_tokens=2)
    engine = make_engine(KVPolicy.full(), num_blocks=128, timing=minute, on_tick=reports.append)
    async with engine, engine.session() as s:
        with anyio.fail_after(20):
            await s.append("a question of many tokens")
            out = await s.step()
    assert len(reports) > 3 and out.tokens
    assert [r.tokens for r in reports if r.latencies] == [1]


async def test_a_turn_ahead_is_paced_while_another_session_may_send_on_the_beat() -> None:
    period = 0.05
    reports: list[TickReport] = []
    engine = make_engine(
        KVPolicy.full(),
        num_blocks=128,
        timing=TimingConfig(period=period, deadline=60.0, max_chunk_tokens=8, tick_tokens=2),
        on_tick=reports.append,
    )
    async with engine, engine.session() as talking, engine.session() as s:
        await talking.step("hi")
        before = len(reports)
        await s.append("a question of many tokens")
    starts = [r.time - r.step_seconds for r in reports[before:]]
    assert len(starts) > 3
    assert starts[-1] - starts[0] >= (len(starts) - 1) * period * 0.9  # one tick a period at most
