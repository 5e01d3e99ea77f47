"""The end of a turn by its words: ``TextTurn`` on the real model, and the agent asking it at a pause."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import numpy as np
import numpy.typing as npt
import pytest

from metronome_bench.eval.turns import CHOOSING, PAUSED, Policy, Recording, choose_threshold, run_policy
from metronome_sdk.cli import main
from metronome_sdk.transports import MemoryTransport
from metronome_sdk.voice import TextTurn, TextTurnModel, VoiceActivityDetector, VoiceAgent
from tests.sdk.conftest import make_engine
from tests.voice.test_listening_ahead import RATE, SizeSTT, Verdict, _heard, _quiet, _tone, _until_answered
from tests.voice.test_turns import _talk
from tests.webrtc.conftest import ToneTTS

pytestmark = pytest.mark.timeout(180)


class Words:
    """A words model that says the same of every transcript; records what it read."""

    def __init__(self, finished: bool) -> None:
        self.answer = finished
        self.read: list[str] = []

    def finished(self, text: str) -> bool:
        self.read.append(text)
        return self.answer


Script = Callable[[list[dict[str, object]]], Awaitable[None]]


async def _converse(
    agent_kwargs: dict[str, object], script_for: Callable[[MemoryTransport], Script], stt: SizeSTT | None = None
) -> tuple[list[dict[str, object]], SizeSTT]:
    """One call with a listening agent (``agent_kwargs`` on top of a 10 s turn gap) and what the caller does."""
    engine = make_engine()
    await engine.start()
    stt = stt or SizeSTT()
    try:
        async with engine.session("be brief") as session, MemoryTransport() as transport:
            agent = VoiceAgent(session, transport, stt=stt, tts=ToneTTS(), turn_gap=10.0, **agent_kwargs)  # type: ignore[arg-type]
            events = await _talk(agent, transport, script_for(transport))
    finally:
        await engine.aclose()
    return events, stt


async def _one_turn(agent_kwargs: dict[str, object], audio: npt.NDArray[np.int16]) -> tuple[list[object], SizeSTT]:
    events, stt = await _converse(agent_kwargs, lambda transport: _until_answered(transport, audio))  # type: ignore[arg-type,return-value]
    return _heard(events), stt


async def test_the_words_model_ends_the_turn_at_the_pause_before_the_silence_would() -> None:
    words = Words(finished=True)
    # the silence would take 3 s and no audio gap ends it: only the words model can end this turn
    vad = VoiceActivityDetector(end_silence=3.0)
    heard, stt = await _one_turn(
        {"vad": vad, "early_transcribe": True, "text_turn": words}, np.concatenate([_tone(0.8), _quiet(0.6)])
    )
    assert heard == [f"heard {stt.calls[0]}"]
    assert words.read == [f"heard {stt.calls[0]}"]  # it read the pause's transcript, which is the turn's


async def test_every_model_given_must_say_finished() -> None:
    sound, words = Verdict(complete=True), Words(finished=False)

    def script_for(transport: MemoryTransport) -> Script:
        async def script(events: list[dict[str, object]]) -> None:
            await transport.push_audio(np.concatenate([_tone(0.8), _quiet(0.6)]), RATE)
            with anyio.fail_after(30):
                while not (sound.asked and words.read):
                    await anyio.sleep(0.01)
            await anyio.sleep(0.2)  # the sound says finished, the words not: no turn may end now
            assert not _heard(events)
            words.answer = True  # the caller goes on, and at the next pause both say finished
            await transport.push_audio(np.concatenate([_tone(0.8), _quiet(0.6)]), RATE)
            with anyio.fail_after(30):
                while not _heard(events):
                    await anyio.sleep(0.02)
            transport.hang_up()

        return script

    kwargs = {"vad": VoiceActivityDetector(end_silence=3.0), "early_transcribe": True, "turn_model": sound}
    events, stt = await _converse({**kwargs, "text_turn": words}, script_for)
    [heard] = _heard(events)  # one turn, both parts, ended at the second pause, well before 3 s of silence
    assert heard == f"heard {stt.calls[-1]}" and stt.calls[-1] >= 1.6 * RATE
    assert len(sound.asked) == 2 and len(words.read) == 2


@pytest.mark.parametrize("transcribe_pause", [0.03, None])
async def test_a_shorter_transcribe_pause_hears_sooner_and_ends_the_turn_no_sooner(
    transcribe_pause: float | None,
) -> None:
    words = Words(finished=True)

    def script_for(transport: MemoryTransport) -> Script:
        async def script(events: list[dict[str, object]]) -> None:
            await transport.push_audio(np.concatenate([_tone(0.8), _quiet(0.15)]), RATE)  # a pause under 0.3 s
            await anyio.sleep(0.5)
            if transcribe_pause is None:
                assert not stt.calls and not words.read  # nothing heard ahead before the pause
            else:
                with anyio.fail_after(30):
                    while not words.read:  # transcribed and judged finished at the short pause
                        await anyio.sleep(0.01)
            assert not _heard(events)  # and no turn ends before the pause has lasted 0.3 s
            await transport.push_audio(_quiet(0.4), RATE)
            with anyio.fail_after(30):
                while not _heard(events):
                    await anyio.sleep(0.02)
            transport.hang_up()

        return script

    stt = SizeSTT()
    vad = VoiceActivityDetector(end_silence=3.0)  # only the words model ends this turn
    kwargs = {"vad": vad, "early_transcribe": True, "text_turn": words, "pause": 0.3}
    events, _ = await _converse({**kwargs, "transcribe_pause": transcribe_pause}, script_for, stt)
    assert _heard(events) == [f"heard {stt.calls[0]}"] and len(stt.calls) == 1  # the early transcript is the turn's
    assert words.read == [f"heard {stt.calls[0]}"]


async def test_agent_checks_the_words_model() -> None:
    stt, tts = SizeSTT(), ToneTTS()
    assert isinstance(Words(True), TextTurnModel)
    engine = make_engine()
    await engine.start()
    try:
        async with engine.session() as session, MemoryTransport() as transport:
            with pytest.raises(ValueError, match="text_turn must have finished"):
                VoiceAgent(session, transport, stt=stt, tts=tts, early_transcribe=True, text_turn=object())  # type: ignore[arg-type]
            with pytest.raises(ValueError, match="early_transcribe=True"):
                VoiceAgent(session, transport, stt=stt, tts=tts, text_turn=Words(True))
            with pytest.raises(ValueError, match=r"transcribe_pause must be in \(0, 2\] seconds"):
                VoiceAgent(session, transport, stt=stt, tts=tts, early_transcribe=True, transcribe_pause=0.0)
    finally:
        await engine.aclose()


def test_eval_turns_asks_the_words_model_at_each_pause_and_counts_a_false_end() -> None:
    # a first phrase, a pause, the rest: a words model that says finished cuts the sentence at its pause
    samples = np.concatenate([_quiet(0.5), _tone(0.8), _quiet(0.5), _tone(0.8), _quiet(2.0)])
    recording = Recording("a ... b", "tone", samples, speech_end=2.6, gap=0.5, gap_start=1.3)
    vad = lambda: VoiceActivityDetector(end_silence=1.0)  # noqa: E731
    eager = run_policy(Policy("words", vad, words=Words(True), stt=SizeSTT()), recording)
    patient = run_policy(Policy("words", vad, words=Words(False), stt=SizeSTT()), recording)
    assert eager.false_end and len(eager.heard) >= 1
    assert not patient.false_end and patient.wait is not None and patient.wait >= 0.9  # the silence ended it
    with pytest.raises(ValueError, match="stt"):
        Policy("words", vad, words=Words(True))


# the real model ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def text_turn() -> TextTurn:
    model = TextTurn()
    model.load()
    return model


def test_a_half_question_reads_unfinished_and_a_whole_one_finished(text_turn: TextTurn) -> None:
    half, whole = (
        text_turn.probability("What is the capital of"),
        text_turn.probability("What is the capital of France"),
    )
    assert half < text_turn.threshold < whole
    assert not text_turn.finished("What is the capital of") and text_turn.finished("What is the capital of France")


def test_the_recognizers_closing_punctuation_is_not_read(text_turn: TextTurn) -> None:
    # Whisper punctuates a fragment as a whole sentence: "What is the capital of?" must still read as half
    assert text_turn.prompt(" What is the capital of? ") == text_turn.prompt("What is the capital of")
    assert not text_turn.finished("What is the capital of?")
    assert text_turn.prompt("one two") != text_turn.prompt("one two three")


def test_text_turn_checks_its_input(text_turn: TextTurn) -> None:
    with pytest.raises(ValueError, match="words heard"):
        text_turn.probability("   ")
    assert not text_turn.finished("")
    for bad in (0.0, 1.0, True, "0.5"):
        with pytest.raises(ValueError, match="threshold"):
            TextTurn(threshold=bad)  # type: ignore[arg-type]


def test_the_threshold_is_chosen_on_sentences_the_eval_does_not_score() -> None:
    assert not {a for a, _ in CHOOSING} & {a for a, _ in PAUSED}
    # a model that reads the first five first phrases as finished, and every whole sentence but the last
    firsts = {a: (0.3 if i < 5 else 0.01) for i, (a, _) in enumerate(CHOOSING)}
    wholes = {f"{a} {b}": (0.02 if i == len(CHOOSING) - 1 else 0.9) for i, (a, b) in enumerate(CHOOSING)}
    report = choose_threshold(lambda text: firsts.get(text, wholes.get(text, 0.0)))
    assert report["best"]["above"] == 0.3 and report["best"]["below"] == 0.9  # every whole but one, no first phrase
    assert report["best"]["j"] == pytest.approx(0.95)


def test_eval_turns_chooses_the_threshold_on_its_own_sentences(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert main(["eval", "turns", "--choose-threshold", "--out", str(tmp_path), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report == json.loads((tmp_path / "threshold.json").read_text())
    assert len(report["sentences"]) == len(CHOOSING)
    best = report["best"]
    assert best["above"] < TextTurn().threshold <= best["below"]  # the default sits in the best split


def test_a_call_reads_the_message_after_the_template_kept_prefilled(text_turn: TextTurn) -> None:
    from metronome_engine import EngineCore, KVPolicy, StepRequest

    # the whole prompt read by an engine of its own: what the template kept prefilled must equal
    core = EngineCore.from_pretrained(policy=KVPolicy.full(), num_blocks=16)
    texts = ("What is the capital of", "Remind me to call my mother", "how do I make a cup of tea")
    for text in texts:
        seq = core.add_sequence()
        (out,) = core.step([StepRequest(seq, text_turn.prompt(text), return_logits=True)])
        core.free_sequence(seq)
        assert out.logits is not None
        whole = float(out.logits.float().softmax(-1)[text_turn.endings].sum())
        assert text_turn.probability(text) == pytest.approx(whole, rel=1e-3, abs=1e-6)
    before = [text_turn.probability(t) for t in texts]
    # long messages, one after another: 16 blocks hold two of them, so a call that did not go back to
    # the template (or leaked a block) would stall here, and a stale context would change the answers
    for _ in range(20):
        text_turn.probability(" ".join(["word"] * 80))
    assert [text_turn.probability(t) for t in texts] == before
