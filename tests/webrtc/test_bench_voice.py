"""``metronome bench voice``'s callers, for real over loopback, against a server with a tiny engine.

The callers speak tones (the tiny server's turn detector hears loudness, its voice speaks
tones), so this checks the callers' own clock and bookkeeping, not the demo's speed.
"""

from __future__ import annotations

import numpy as np
import pytest

from metronome_bench.voice import RATE, Refused, SpokenQuestion, run_round, summarize
from metronome_sdk import Engine
from tests.webrtc.conftest import tiny_server

pytestmark = pytest.mark.timeout(90)


def _tone_question(text: str, seconds: float = 0.6) -> SpokenQuestion:
    t = np.arange(round(seconds * RATE)) / RATE
    pcm = (8000 * np.sin(2 * np.pi * 300 * t)).astype(np.int16)
    return SpokenQuestion(text, "tone", np.concatenate([pcm, np.zeros(RATE // 2, dtype=np.int16)]))


async def test_two_callers_each_time_their_turns_and_get_the_servers_breakdown(tiny_engine: Engine) -> None:
    questions = [_tone_question("one?"), _tone_question("two?")]
    async with tiny_server(tiny_engine) as server:
        results = await run_round(server.url, questions, callers=2, turns=2, stagger=0.2, timeout=20)
    assert [(r.caller, r.question) for r in results] == [(0, "one?"), (0, "one?"), (1, "two?"), (1, "two?")]
    for r in results:
        assert r.voice_to_voice is not None and r.voice_to_voice > 0
        assert r.heard == "hello there"  # the tiny server's recognizer hears that in everything
        assert r.answer  # the tiny model said something, whatever it is
        assert r.server is not None and r.server["voice_to_voice"] > 0
        assert r.frames and all(n >= 1 for n in r.frames)  # each reply frame's tokens, as the server sent them
        assert r.as_dict()["frames"] == list(r.frames)
    s = summarize(2, results)
    assert s["turns"] == 4 and s["no_reply"] == 0
    assert s["p50"] is not None and s["p95"] is not None and s["p50"] <= s["p95"]
    assert "transcribe" in s["server_median"]


async def test_a_caller_the_server_refuses_is_counted_with_its_retry_after(tiny_engine: Engine) -> None:
    # one peer at most: the second caller is refused (503 + Retry-After) and counted, not an error
    questions = [_tone_question("one?"), _tone_question("two?")]
    async with tiny_server(tiny_engine, max_peers=1, busy_retry_after=3.0) as server:
        refused: list[dict[str, object]] = []
        results = await run_round(server.url, questions, callers=2, turns=1, stagger=0.5, timeout=20, refused=refused)
        with pytest.raises(Refused) as raised:  # without a list to count them in, a refusal is an error
            await run_round(server.url, questions, callers=2, turns=1, stagger=0.0, timeout=20)
    assert raised.value.status == 503 and raised.value.retry_after == 3.0
    assert [r.caller for r in results] == [0]
    assert [(r["caller"], r["status"], r["error"], r["retry_after"]) for r in refused] == [
        (1, 503, "too_many_peers", 3.0)
    ]
    s = summarize(2, results, refused)
    assert s["admitted"] == 1 and s["refused"] == refused
    assert s["refused_within_s"] is not None and 0 < s["refused_within_s"] < 20


def test_held_within_the_objective_counts_rounds_all_admitted_and_within_it() -> None:
    from metronome_bench.commands.bench_voice import _held

    rounds = [
        {"callers": 1, "admitted": 1, "p95": 1.4},
        {"callers": 2, "admitted": 2, "p95": 1.6},
        {"callers": 4, "admitted": 1, "p95": 1.0},  # only one admitted: not held at four
    ]
    assert (_held(rounds, 1.5), _held(rounds, 2.0), _held(rounds, 1.0), _held(rounds, None)) == (1, 2, 0, None)


async def test_a_server_that_answers_ahead_sends_the_answer_of_the_pause_once_the_turn_ends(
    tiny_engine: Engine,
) -> None:
    # the 0.5 s after the tone is past the agent's 0.2 s pause and short of nothing: loudness ends
    # the turn after 0.7 s of quiet, so the answer begun at the pause is confirmed by the turn's end
    questions = [_tone_question("one?", seconds=0.8)]
    async with tiny_server(tiny_engine, answer_ahead=True) as server:
        results = await run_round(server.url, questions, callers=1, turns=2, timeout=20)
    for r in results:
        assert r.voice_to_voice is not None and r.heard == "hello there" and r.answer
        assert r.ahead is True and r.server is not None and "ahead" not in r.server  # answered ahead, confirmed
    assert summarize(1, results)["answered_ahead"] == 2
    stats = tiny_engine.stats()
    assert stats.sessions == 0 and stats.used_blocks == 0  # the held blocks went back with the call
