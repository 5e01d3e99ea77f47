"""history=False: each turn is taken back once answered, so every question is heard as the call's first."""

from __future__ import annotations

import anyio
import pytest

from metronome_sdk import Engine
from metronome_sdk.transports import MemoryTransport
from metronome_sdk.voice import VoiceActivityDetector, VoiceAgent
from tests.sdk.conftest import make_engine
from tests.voice.test_turns import _final_answers, ask_twice
from tests.webrtc.conftest import FixedSTT, ToneTTS

pytestmark = pytest.mark.timeout(120)


async def _call(
    engine: Engine, *, history: bool, ahead: bool, rewind_tokens: int = 64
) -> tuple[list[str], int, int, int]:
    """Two turns asking the same words: the answers, the session's tokens after its prompt and at the end,
    and the turns kept for being too long to take back."""
    events: list[dict[str, object]] = []
    async with engine.session("be brief", rewind_tokens=rewind_tokens) as session, MemoryTransport() as transport:
        await session.append("hi")  # the prompt and a first turn in, so the context's start is known
        await session.step()
        start = session.stats().num_tokens
        agent = VoiceAgent(
            session,
            transport,
            stt=FixedSTT("what is the capital of france"),
            tts=ToneTTS(),
            vad=VoiceActivityDetector(),
            early_transcribe=ahead,
            answer_ahead=ahead,
            history=history,
            max_reply_tokens=6,
            turn_gap=10.0,
        )

        async def read() -> None:
            async for event in transport.events():
                events.append(event)

        async with anyio.create_task_group() as tg:
            tg.start_soon(read)
            tg.start_soon(ask_twice, agent, transport, events)
            with anyio.fail_after(60):
                await agent.run()
            tg.cancel_scope.cancel()
        end = session.stats().num_tokens
    return [str(e["text"]) for e in _final_answers(events)], start, end, agent.kept_turns


@pytest.mark.parametrize("ahead", [False, True], ids=["at_the_turns_end", "answered_ahead"])
async def test_without_history_each_turn_goes_back_and_the_same_question_gets_the_same_answer(ahead: bool) -> None:
    engine = make_engine()
    async with engine:
        answers, start, end, too_long = await _call(engine, history=False, ahead=ahead)
        kept, kept_start, kept_end, _ = await _call(engine, history=True, ahead=ahead)
    assert len(answers) == 2 and answers[0] == answers[1] != ""  # the second turn saw what the first saw
    assert end == start and too_long == 0  # the context is the prompt's (and the turn before the agent) again
    assert len(kept) == 2 and kept_end > kept_start  # with history the turns stay in the context


async def test_without_history_a_session_needs_rewind_tokens() -> None:
    engine = make_engine()
    async with engine, engine.session("be brief") as session, MemoryTransport() as transport:
        with pytest.raises(ValueError, match="rewind_tokens"):
            VoiceAgent(session, transport, stt=FixedSTT("hi"), tts=ToneTTS(), history=False)


async def test_a_turn_too_long_to_take_back_stays_and_the_next_goes_back_to_its_end() -> None:
    engine = make_engine()
    async with engine:
        # 8 tokens of room: the turn and its reply pass it, so the first turn stays in the context
        answers, start, end, too_long = await _call(engine, history=False, ahead=False, rewind_tokens=8)
    assert len(answers) == 2 and end > start and too_long == 2  # each turn stayed, and the call went on
