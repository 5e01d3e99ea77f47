"""Answering ahead: the answer starts at a pause, is held until the turn ends, and is taken back exactly."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import anyio
import numpy as np
import pytest

from metronome_sdk import Engine
from metronome_sdk.transports import MemoryTransport
from metronome_sdk.voice import VoiceActivityDetector, VoiceAgent
from tests.sdk.conftest import make_engine
from tests.voice.test_listening_ahead import RATE, SizeSTT, _heard, _quiet, _tone
from tests.voice.test_turns import _final_answers
from tests.webrtc.conftest import ToneTTS

pytestmark = pytest.mark.timeout(120)

# the caller's side of one call: its microphone, the agent's session, the events it got, and whether it answers ahead
Script = Callable[[MemoryTransport, object, list[dict[str, object]], bool], Awaitable[None]]


async def _until(check: Callable[[], bool]) -> None:
    with anyio.fail_after(30):
        while not check():
            await anyio.sleep(0.01)


Call = tuple[VoiceAgent, list[dict[str, object]], int, tuple[int, int]]


async def _call(engine: Engine, script: Script, *, ahead: bool, rewind_tokens: int = 64) -> Call:
    """One call on ``engine``: the agent's counts, its events, the samples of speech it sent, and the
    session's (tokens, turns) at the end."""
    events: list[dict[str, object]] = []
    sent = 0
    async with engine.session("be brief", rewind_tokens=rewind_tokens) as session, MemoryTransport() as transport:
        agent = VoiceAgent(
            session,
            transport,
            stt=SizeSTT(),
            tts=ToneTTS(),
            vad=VoiceActivityDetector(),
            early_transcribe=True,
            answer_ahead=ahead,
            max_reply_tokens=8,
            turn_gap=10.0,  # this microphone is not paced in real time: only the VAD's silence ends a turn
        )

        async def read() -> None:
            async for event in transport.events():
                events.append(event)

        async def listen() -> None:
            nonlocal sent
            async for chunk in transport.audio():
                sent += chunk.size

        async with anyio.create_task_group() as tg:
            tg.start_soon(read)
            tg.start_soon(listen)
            tg.start_soon(script, transport, session, events, ahead)
            with anyio.fail_after(60):
                await agent.run()
            tg.cancel_scope.cancel()
        stats = session.stats()
    return agent, events, sent, (stats.num_tokens, stats.turns)


async def _both(script: Script) -> tuple[Call, Call]:
    """The same call answered ahead, then not, one after the other on one engine (the same numbers)."""
    engine = make_engine()
    async with engine:
        return await _call(engine, script, ahead=True), await _call(engine, script, ahead=False)


async def _answered(transport: MemoryTransport, events: list[dict[str, object]]) -> None:
    await _until(lambda: bool(_final_answers(events)))
    await anyio.sleep(0.2)  # its speech goes out
    transport.hang_up()


async def test_an_answer_begun_at_the_pause_waits_for_the_turn_to_end_then_goes_out_at_once() -> None:
    async def script(transport: MemoryTransport, session: object, events: list[dict[str, object]], ahead: bool) -> None:
        await transport.push_audio(np.concatenate([_tone(0.8), _quiet(0.3)]), RATE)  # a pause, not yet the end
        if ahead:
            await _until(lambda: session.stats().turns == 1)  # type: ignore[attr-defined]  # the answer began
        await anyio.sleep(0.3)
        assert [e for e in events if e["type"] != "stats"] == [
            {"type": "ready", "session_id": session.id, "deadline": 60.0},  # type: ignore[attr-defined]
            {"type": "state", "state": "listening"},
        ]  # nothing of it reached the caller yet
        await transport.push_audio(_quiet(1.0), RATE)  # the silence ends the turn
        await _answered(transport, events)

    (agent, events, sent, context), (plain, plain_events, plain_sent, plain_context) = await _both(script)
    assert (agent.answered_ahead, agent.withdrawn_ahead, plain.answered_ahead) == (1, 0, 0)
    assert _heard(events) == _heard(plain_events)
    assert [e["text"] for e in _final_answers(events)] == [e["text"] for e in _final_answers(plain_events)]
    assert context == plain_context and sent == plain_sent > 0
    [latency] = [e for e in events if e["type"] == "latency"]
    assert latency["ahead"] is True
    parts = ("turn_end", "transcribe", "first_token", "first_clause", "synthesize", "send")
    assert all(latency[p] >= 0 for p in parts)  # type: ignore[operator]
    assert sum(latency[p] for p in parts) == pytest.approx(latency["voice_to_voice"])  # type: ignore[misc]
    # the recognizer and the voice ran for it before the turn ended: no wait, but work all the same
    assert latency["transcribe"] == 0 and latency["speech_work"] > 0  # type: ignore[operator]
    user = next(i for i, e in enumerate(events) if e["type"] == "transcript" and e["role"] == "user")
    assert user < events.index(latency)  # the held events went out first, in their order


async def test_a_caller_who_goes_on_gets_the_answer_withdrawn_and_the_context_as_if_it_never_began() -> None:
    async def script(transport: MemoryTransport, session: object, events: list[dict[str, object]], ahead: bool) -> None:
        await transport.push_audio(np.concatenate([_tone(0.6), _quiet(0.3)]), RATE)
        if ahead:
            await _until(lambda: session.stats().turns == 1)  # type: ignore[attr-defined]  # the answer began
            await anyio.sleep(0.3)
        await transport.push_audio(np.concatenate([_tone(0.6), _quiet(1.0)]), RATE)  # the caller goes on
        await _answered(transport, events)

    (agent, events, sent, context), (plain, plain_events, plain_sent, plain_context) = await _both(script)
    assert agent.withdrawn_ahead == 1 and plain.withdrawn_ahead == plain.answered_ahead == 0
    assert len(_heard(events)) == 1 and _heard(events) == _heard(plain_events)  # the whole utterance, once
    assert [e["text"] for e in _final_answers(events)] == [e["text"] for e in _final_answers(plain_events)]
    assert context == plain_context  # the same tokens and turns as a session that never answered ahead
    assert sent == plain_sent  # not a sample of the withdrawn answer reached the caller
    assert not any(e["type"] == "interrupted" for e in events)  # the caller never heard it: nothing to cut


async def test_without_rewind_tokens_nothing_is_answered_ahead() -> None:
    async def script(transport: MemoryTransport, session: object, events: list[dict[str, object]], ahead: bool) -> None:
        await transport.push_audio(np.concatenate([_tone(0.8), _quiet(1.2)]), RATE)
        await _answered(transport, events)

    engine = make_engine()
    async with engine:
        agent, events, _, _ = await _call(engine, script, ahead=True, rewind_tokens=0)
    assert agent.answered_ahead == agent.withdrawn_ahead == 0 and _final_answers(events)
