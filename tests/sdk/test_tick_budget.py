"""The per-tick token budget, the calibrated cap and the slow-vs-stuck watchdog, on a slowed backend.

The issue's failure, in small: six sessions each send a long prompt at once to a machine
that appends tokens slowly; one tick that took every prompt's chunk ran past the watchdog
and every session got ``EngineStalled``. With the budget each tick fits the deadline,
prefill is spread over ticks and every session is answered.
"""

from __future__ import annotations

import anyio
import pytest

from metronome_engine import KVPolicy
from metronome_sdk import (
    AdmissionConfig,
    Engine,
    EngineStalled,
    LoadShed,
    OutputFrame,
    ReliabilityConfig,
    Session,
    TickReport,
    TimingConfig,
)
from tests.sdk.conftest import CharTokenizer, make_engine
from tests.sdk.slowed import SlowedBackend

pytestmark = pytest.mark.timeout(120)

PROMPT = [10 + i % 80 for i in range(120)]  # 120 tokens: two chunks of 64
SESSIONS = 6
DEADLINE = 0.08
WATCHDOG = ReliabilityConfig(watchdog=4.0, watchdog_floor=0.5)  # a step is judged after 0.5 s


def slowed_engine(
    *, timing: TimingConfig | None = None, admission: AdmissionConfig | None = None, **kwargs: object
) -> tuple[Engine, SlowedBackend, list[TickReport]]:
    # 5 ms a step plus 2 ms a token: six 64-token chunks in one step would take 0.77 s
    core = SlowedBackend(KVPolicy.windowed(8, sinks=4), fixed=0.005, per_token=0.002)
    ticks: list[TickReport] = []
    engine = Engine(
        core=core,
        timing=timing or TimingConfig(period=DEADLINE, max_chunk_tokens=64),
        admission=admission or AdmissionConfig(queue_timeout=0.0),
        tokenizer=CharTokenizer(),
        on_tick=ticks.append,
        **kwargs,  # type: ignore[arg-type]
    )
    return engine, core, ticks


async def talk_at_once(sessions: list[Session], decode_frames: int) -> dict[int, list[OutputFrame | BaseException]]:
    """Every session sends its prompt in the same tick, then ``decode_frames`` empty frames."""
    got: dict[int, list[OutputFrame | BaseException]] = {s.id: [] for s in sessions}
    for s in sessions:
        await s.send(tuple_frame())

    async def one(s: Session) -> None:
        try:
            got[s.id].append(await s.receive())
            for _ in range(decode_frames):
                got[s.id].append(await s.step(None))
        except (EngineStalled, LoadShed) as exc:
            got[s.id].append(exc)

    async with anyio.create_task_group() as tg:
        for s in sessions:
            tg.start_soon(one, s)
    return got


def tuple_frame() -> object:
    from metronome_sdk import InputFrame

    return InputFrame.from_tokens(PROMPT)


async def test_six_long_prompts_at_once_are_all_answered_within_the_budget() -> None:
    engine, _, ticks = slowed_engine(reliability=WATCHDOG)
    async with engine:
        stats = engine.stats()
        assert stats.tick_tokens is not None and stats.tick_tokens < SESSIONS * 64  # measured, not unbounded
        sessions = [engine.try_session() for _ in range(SESSIONS)]
        got = await talk_at_once(sessions, decode_frames=3)
        for s in sessions:
            await s.aclose()
        stats = engine.stats()
    for outs in got.values():
        assert all(isinstance(o, OutputFrame) and o.tokens for o in outs), outs  # every frame answered
        assert [o.index for o in outs if isinstance(o, OutputFrame)] == [0, 1, 2, 3]
    assert (stats.stalls, stats.stuck_steps, stats.shed, stats.slow_steps) == (0, 0, 0, 0)
    assert all(t.tick_tokens is not None and t.tokens <= t.tick_tokens for t in ticks)
    assert any(t.waiting for t in ticks) and stats.budget_waits > 0  # the prompts were spread over ticks
    assert sum(t.tokens for t in ticks) >= SESSIONS * len(PROMPT)  # every prompt token was appended


async def test_without_the_budget_the_same_load_is_stuck_as_the_issue_saw() -> None:
    # no budget, nothing measured: one tick takes every chunk and runs past the watchdog
    engine, _, _ = slowed_engine(
        timing=TimingConfig(period=DEADLINE, max_chunk_tokens=64, tick_tokens=None),
        admission=AdmissionConfig(initial_limit=SESSIONS, queue_timeout=0.0),
        reliability=WATCHDOG,
    )
    async with engine:
        assert engine.stats().tick_tokens is None
        sessions = [engine.try_session() for _ in range(SESSIONS)]
        got = await talk_at_once(sessions, decode_frames=0)
        for s in sessions:
            await s.aclose()
    reasons = {o.reason for outs in got.values() for o in outs if isinstance(o, EngineStalled)}
    assert "step_stuck" in reasons


async def test_a_slow_step_sheds_load_instead_of_failing_every_session() -> None:
    # no budget, but a measured cost: the long step is within what its tokens take, so it is slow,
    # not stuck; it runs two watchdog periods (0.32 s each), so the cap is cut and one session shed
    engine, _, _ = slowed_engine(
        timing=TimingConfig(period=DEADLINE, max_chunk_tokens=64, tick_tokens=None),
        reliability=ReliabilityConfig(watchdog=4.0, watchdog_floor=0.0),
    )
    async with engine:
        before = engine.stats().limit
        sessions = [engine.try_session() for _ in range(SESSIONS)]
        got = await talk_at_once(sessions, decode_frames=2)
        for s in sessions:
            await s.aclose()
        stats = engine.stats()
    errors = [o for outs in got.values() for o in outs if isinstance(o, BaseException)]
    assert not [e for e in errors if isinstance(e, EngineStalled)]
    assert errors and all(isinstance(e, LoadShed) for e in errors)
    assert stats.slow_steps >= 1 and stats.stuck_steps == 0 and stats.limit < before
    answered = [outs for outs in got.values() if not any(isinstance(o, BaseException) for o in outs)]
    assert len(answered) >= 1 and all(len(outs) == 3 for outs in answered)


async def test_the_admission_cap_starts_from_the_calibration() -> None:
    engine, core, _ = slowed_engine()
    async with engine:
        stats = engine.stats()
        assert core.steps  # the calibration ran real steps
        assert stats.tick_tokens is not None and stats.memory_limit is not None
        assert stats.limit == min(stats.memory_limit, stats.tick_tokens)
    engine, _, _ = slowed_engine(admission=AdmissionConfig(session_tokens=9, queue_timeout=0.0))
    async with engine:
        stats = engine.stats()
        assert stats.tick_tokens is not None and stats.memory_limit is not None
        assert stats.limit == max(1, min(stats.memory_limit, stats.tick_tokens // 9))
    engine, core, _ = slowed_engine(
        timing=TimingConfig(period=DEADLINE, tick_tokens=32), admission=AdmissionConfig(initial_limit=3)
    )
    async with engine:
        assert engine.stats().limit == 3 and not core.steps  # told, not measured: no calibration
        assert engine.stats().tick_tokens == 32


async def test_several_decode_tokens_a_frame_are_the_tokens_one_a_tick_gives() -> None:
    frame = tuple(range(20, 30))
    many = make_engine()
    async with many, many.session(decode_tokens=4) as s:
        from metronome_sdk import InputFrame

        first = await s.step(InputFrame.from_tokens(frame))
        second = await s.step(None)
    one = make_engine()
    async with one, one.session() as s:
        singles = [await s.step(InputFrame.from_tokens(frame))] + [await s.step(None) for _ in range(7)]
    flat = [t for o in singles for t in o.tokens]
    got = [*first.tokens, *second.tokens]
    assert 1 <= len(first.tokens) <= 4
    if 1 not in first.tokens:  # no stop token (the stub's is 1): the budget was lax, all four came
        assert len(first.tokens) == 4
    assert got == flat[: len(got)]


async def test_decode_rounds_stay_within_a_small_budget() -> None:
    ticks: list[TickReport] = []
    engine = make_engine(
        timing=TimingConfig(period=0.001, deadline=60.0, max_chunk_tokens=8, tick_tokens=3), on_tick=ticks.append
    )
    async with engine:
        sessions = [engine.try_session(decode_tokens=4) for _ in range(3)]
        for s in sessions:
            await s.send("hi")
        outs = [await s.receive() for s in sessions]
        outs += [await s.step(None) for s in sessions for _ in range(2)]
    assert all(1 <= len(o.tokens) <= 4 for o in outs)
    assert all(t.tokens <= 3 for t in ticks)


def test_decode_tokens_is_checked() -> None:
    engine = make_engine()
    with pytest.raises(ValueError, match="decode_tokens"):
        engine.session(decode_tokens=0)
    s = engine.session(decode_tokens=2)
    with pytest.raises(ValueError, match="decode_tokens"):
        s.decode_tokens = 65
    s.decode_tokens = 8
    assert s.decode_tokens == 8


async def test_chat_with_several_tokens_a_frame_says_the_same_in_fewer_frames() -> None:
    one, many = make_engine(), make_engine()
    async with one, one.session() as a:
        slow = await a.chat("hello", max_tokens=7)
        frames_one = a.stats().frames
    async with many, many.session(decode_tokens=3) as b:
        fast = await b.chat("hello", max_tokens=7)
        frames_many = b.stats().frames
        assert b.decode_tokens == 3  # chat trimmed the last frame to max_tokens, then put it back
    assert fast == slow  # greedy: the same reply, never past max_tokens
    assert frames_many < frames_one or frames_one == 1
