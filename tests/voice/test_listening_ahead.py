"""Listening ahead: the utterance transcribed at a pause, and the turn ended by meaning (smart-turn v3)."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import anyio
import numpy as np
import numpy.typing as npt
import pytest

from metronome_bench.eval.turns import Policy, Recording, run_policy
from metronome_sdk._audio import resample
from metronome_sdk.cli import main
from metronome_sdk.transports import MemoryTransport
from metronome_sdk.voice import SmartTurn, TurnModel, VoiceActivityDetector, VoiceAgent
from tests.sdk.conftest import make_engine
from tests.voice.test_turns import _final_answers, _talk
from tests.webrtc.conftest import ToneTTS, speak

pytestmark = pytest.mark.timeout(180)
RATE = 16000


def _tone(seconds: float) -> npt.NDArray[np.int16]:
    t = np.arange(round(seconds * RATE)) / RATE
    return (8000 * np.sin(2 * np.pi * 300 * t)).astype(np.int16)


def _quiet(seconds: float) -> npt.NDArray[np.int16]:
    return np.zeros(round(seconds * RATE), dtype=np.int16)


class SizeSTT:
    """Hears each utterance as its length in samples; records the calls and the most in flight at once."""

    def __init__(self) -> None:
        self.calls: list[int] = []
        self.most_at_once = 0
        self._running = 0
        self._lock = threading.Lock()

    def transcribe(self, samples: npt.NDArray[np.int16], sample_rate: int) -> str:
        with self._lock:
            self._running += 1
            self.most_at_once = max(self.most_at_once, self._running)
            self.calls.append(samples.size)
        try:
            return f"heard {samples.size}"
        finally:
            with self._lock:
                self._running -= 1


class Verdict:
    """A turn model that always says the same; records the audio it was asked about."""

    sample_rate = RATE

    def __init__(self, complete: bool) -> None:
        self.answer = complete
        self.asked: list[int] = []

    def complete(self, samples: npt.NDArray[np.int16]) -> bool:
        self.asked.append(samples.size)
        return self.answer


def _until_answered(transport: MemoryTransport, *audio: npt.NDArray[np.int16]) -> object:
    """A caller's script: send ``audio``, wait for the (first) answer, hang up."""

    async def script(events: list[dict[str, object]]) -> None:
        await transport.push_audio(np.concatenate(audio), RATE)
        with anyio.fail_after(60):
            while not _final_answers(events):
                await anyio.sleep(0.02)
        transport.hang_up()

    return script


def _heard(events: list[dict[str, object]]) -> list[object]:
    return [e["text"] for e in events if e["type"] == "transcript" and e["role"] == "user"]


async def test_the_transcript_started_at_the_pause_is_the_turns() -> None:
    engine = make_engine()
    await engine.start()
    stt = SizeSTT()
    try:
        async with engine.session("be brief") as session, MemoryTransport() as transport:
            agent = VoiceAgent(
                session, transport, stt=stt, tts=ToneTTS(), vad=VoiceActivityDetector(), early_transcribe=True
            )
            events = await _talk(
                agent, transport, _until_answered(transport, np.concatenate([_tone(0.8), _quiet(1.2)]))
            )
    finally:
        await engine.aclose()
    [size] = stt.calls  # one transcription: started at the pause, before the silence ended the turn
    assert _heard(events) == [f"heard {size}"] and agent.heard_ahead == 1
    assert 0.8 * RATE <= size <= 1.1 * RATE  # the speech (and pre-roll), not the pause


async def test_a_caller_who_goes_on_after_the_pause_gets_the_whole_utterance_transcribed() -> None:
    engine = make_engine()
    await engine.start()
    stt = SizeSTT()
    try:
        async with engine.session("be brief") as session, MemoryTransport() as transport:
            agent = VoiceAgent(
                session, transport, stt=stt, tts=ToneTTS(), vad=VoiceActivityDetector(), early_transcribe=True
            )
            audio = np.concatenate([_tone(0.6), _quiet(0.35), _tone(0.6), _quiet(0.35), _tone(0.6), _quiet(1.2)])
            events = await _talk(agent, transport, _until_answered(transport, audio))
    finally:
        await engine.aclose()
    whole = max(stt.calls)
    assert whole >= 2.5 * RATE  # three tones and the pauses between them
    assert _heard(events) == [f"heard {whole}"]  # never a transcript of a part
    assert stt.most_at_once == 1 and len(stt.calls) <= 4  # at most one at a time; a pause or two, the whole


async def test_without_early_transcription_the_turn_is_transcribed_once_it_ends() -> None:
    engine = make_engine()
    await engine.start()
    stt = SizeSTT()
    try:
        async with engine.session("be brief") as session, MemoryTransport() as transport:
            agent = VoiceAgent(session, transport, stt=stt, tts=ToneTTS(), vad=VoiceActivityDetector())
            events = await _talk(
                agent, transport, _until_answered(transport, np.concatenate([_tone(0.8), _quiet(1.2)]))
            )
    finally:
        await engine.aclose()
    assert len(stt.calls) == 1 and agent.heard_ahead == 0 and _heard(events) == [f"heard {stt.calls[0]}"]


async def test_the_turn_model_ends_the_turn_at_the_pause_before_the_silence_would() -> None:
    engine = make_engine()
    await engine.start()
    stt, model = SizeSTT(), Verdict(complete=True)
    try:
        async with engine.session("be brief") as session, MemoryTransport() as transport:
            # the silence would take 3 s and no audio gap ends it: only the model can end this turn
            vad = VoiceActivityDetector(end_silence=3.0)
            agent = VoiceAgent(session, transport, stt=stt, tts=ToneTTS(), vad=vad, turn_model=model, turn_gap=10.0)
            events = await _talk(
                agent, transport, _until_answered(transport, np.concatenate([_tone(0.8), _quiet(0.5)]))
            )
    finally:
        await engine.aclose()
    assert len(_heard(events)) == 1 and model.asked
    assert model.asked[0] > stt.calls[0]  # it heard the pause too; the transcript is of the speech


async def test_a_turn_the_model_calls_unfinished_waits_for_the_silence() -> None:
    engine = make_engine()
    await engine.start()
    stt, model = SizeSTT(), Verdict(complete=False)
    try:
        async with engine.session("be brief") as session, MemoryTransport() as transport:
            vad = VoiceActivityDetector(end_silence=3.0)
            agent = VoiceAgent(session, transport, stt=stt, tts=ToneTTS(), vad=vad, turn_model=model, turn_gap=10.0)

            async def pause_then_go_on(events: list[dict[str, object]]) -> None:
                await transport.push_audio(np.concatenate([_tone(0.8), _quiet(0.5)]), RATE)
                with anyio.fail_after(30):
                    while not model.asked:
                        await anyio.sleep(0.01)
                await anyio.sleep(0.2)  # the model said "not yet": no turn may end now
                assert not _heard(events)
                await transport.push_audio(np.concatenate([_tone(0.8), _quiet(3.5)]), RATE)
                with anyio.fail_after(30):
                    while not any(
                        e["type"] == "transcript" and e["role"] == "assistant" and e["final"] for e in events
                    ):
                        await anyio.sleep(0.02)
                transport.hang_up()

            events = await _talk(agent, transport, pause_then_go_on)
    finally:
        await engine.aclose()
    [heard] = _heard(events)  # one turn: both parts, ended by the silence
    assert heard == f"heard {stt.calls[-1]}" and stt.calls[-1] >= 2.0 * RATE
    assert len(model.asked) == 2  # once at each pause


async def test_agent_checks_the_listening_settings() -> None:
    class WrongRate:
        sample_rate = 8000

        def complete(self, samples: npt.NDArray[np.int16]) -> bool:
            return True

    assert isinstance(Verdict(True), TurnModel)
    stt, tts = SizeSTT(), ToneTTS()
    engine = make_engine()
    await engine.start()
    try:
        async with engine.session() as session, MemoryTransport() as transport:
            with pytest.raises(ValueError, match="pause"):
                VoiceAgent(session, transport, stt=stt, tts=tts, pause=0.0)
            with pytest.raises(ValueError, match="turn_model must have complete"):
                VoiceAgent(session, transport, stt=stt, tts=tts, turn_model=object())  # type: ignore[arg-type]
            with pytest.raises(ValueError, match="8000 Hz"):
                VoiceAgent(session, transport, stt=stt, tts=tts, turn_model=WrongRate())
    finally:
        await engine.aclose()


# smart-turn v3 itself: real weights, real speech --------------------------------------------------


def test_smart_turn_features_are_whispers_with_an_8_second_chunk() -> None:
    transformers = pytest.importorskip("transformers")
    speech = resample(*speak("What is the capital of France?"), RATE)
    audio = np.concatenate([speech, _quiet(0.2)])
    mine = SmartTurn().features(audio)
    padded = np.pad(audio.astype(np.float32) / 32768.0, (8 * RATE - audio.size, 0))
    reference = transformers.WhisperFeatureExtractor(chunk_length=8)(
        padded,
        sampling_rate=RATE,
        return_tensors="np",
        padding="max_length",
        max_length=8 * RATE,
        truncation=True,
        do_normalize=True,
    ).input_features
    assert mine.shape == reference.shape == (1, 80, 800)
    assert np.abs(mine - reference).max() < 1e-3


def test_smart_turn_hears_a_finished_question_and_an_unfinished_one() -> None:
    model = SmartTurn()
    finished = resample(*speak("What is the capital of France?"), RATE)
    unfinished = resample(*speak("I was wondering if you could tell me"), RATE)
    assert model.complete(np.concatenate([finished, _quiet(0.2)]))
    assert not model.complete(np.concatenate([unfinished, _quiet(0.2)]))
    assert 0.0 <= model.probability(_quiet(0.5)) <= 1.0
    long = np.concatenate([_quiet(10.0), finished, _quiet(0.2)])  # only the last 8 s are heard
    assert model.probability(long) == pytest.approx(model.probability(long[-8 * RATE :]), abs=1e-5)


def test_smart_turn_checks_its_input_and_settings(tmp_path: object) -> None:
    with pytest.raises(ValueError, match="no samples"):
        SmartTurn().probability(np.zeros(0, dtype=np.int16))
    with pytest.raises(ValueError, match="threshold"):
        SmartTurn(threshold=1.0)
    with pytest.raises(ValueError, match="threads"):
        SmartTurn(threads=0)
    with pytest.raises(FileNotFoundError, match="no smart-turn"):
        SmartTurn(model="/nonexistent/model.onnx")


# `metronome eval turns`: the set of paused sentences and the policies ---------------------------


def test_a_policy_ends_turns_by_silence_or_by_its_model() -> None:
    pause_at = 0.5 + 0.6  # lead, first phrase
    samples = np.concatenate([_quiet(0.5), _tone(0.6), _quiet(0.8), _tone(0.6), _quiet(2.0)])
    paused = Recording("one ... two", "tones", samples, speech_end=pause_at + 0.8 + 0.6, gap=0.8, gap_start=pause_at)
    silence = run_policy(Policy("silence 0.7 s", VoiceActivityDetector), paused)
    assert silence.false_end and len(silence.ends) == 2  # 0.8 s of pause is a turn's end to 0.7 s of silence
    assert silence.ends[0] == pytest.approx(pause_at + 0.7, abs=0.03)
    patient = run_policy(Policy("silence 1 s", lambda: VoiceActivityDetector(end_silence=1.0)), paused)
    assert not patient.false_end and patient.wait == pytest.approx(1.0, abs=0.03)
    eager = Verdict(complete=True)
    smart = run_policy(Policy("model", lambda: VoiceActivityDetector(end_silence=1.0), eager, 0.2), paused)
    assert smart.false_end and smart.ends[0] >= pause_at + 0.2  # it said "done" at the pause: the turn ended there
    assert len(eager.asked) == 2 and len(smart.model_seconds) == 2
    careful = run_policy(Policy("model", lambda: VoiceActivityDetector(end_silence=1.0), Verdict(False), 0.2), paused)
    assert careful.ends == patient.ends  # "not yet" leaves it to the silence


def test_eval_turns_prints_the_wait_and_the_false_ends(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    args = ["eval", "turns", "--sentences", "2", "--voices", "espeak-en-us", "--out", str(tmp_path), "--json"]
    assert main(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert report == json.loads((tmp_path / "turns.json").read_text())
    policies = {p["policy"]: p for p in report["policies"]}
    assert list(policies) == [
        "silence 0.55 s",
        "silence 1 s",
        "smart-turn, else silence 0.55 s",
        "smart-turn, else silence 1 s",
        "words, else silence 0.55 s",
        "words, else silence 1 s",
        "both, else silence 0.55 s",
        "both, else silence 1 s",
    ]
    for p in policies.values():
        assert p["whole"]["recordings"] == p["paused"]["recordings"] == 2
        assert p["whole"]["false_ends"] == 0 and p["whole"]["no_end"] == 0  # a whole sentence ends once, at its end
    # the two paused sentences stop for 0.4 and 0.5 s: shorter than either silence
    assert policies["silence 1 s"]["paused"]["false_ends"] == policies["silence 0.55 s"]["paused"]["false_ends"] == 0
    assert policies["silence 1 s"]["whole"]["wait_median"] > policies["silence 0.55 s"]["whole"]["wait_median"] + 0.4
    smart = policies["smart-turn, else silence 0.55 s"]
    assert smart["model_calls"] >= 4 and smart["against"] == "silence 0.55 s" and "thresholds" in smart
    words = policies["words, else silence 1 s"]
    assert words["model_calls"] >= 4 and words["against"] == "silence 1 s"
    heard = [h for r in words["recordings"] for h in r["heard"]]
    assert heard and all(isinstance(h, str) for h in heard)  # what Whisper heard at each pause asked
    # "What is the capital of ... France?": the words at its pause read unfinished, so only the silence ends it
    capital = next(r for r in words["recordings"] if r["text"] == "What is the capital of ... France?")
    assert not capital["false_end"]
    with pytest.raises(SystemExit):
        main(["eval", "turns", "--silences", "9"])
    with pytest.raises(SystemExit):
        main(["eval", "turns", "--models", "sound"])
    assert main(["eval", "turns", "--sentences", "11"]) == 2


def test_the_vad_tells_the_turn_so_far_and_ends_it_on_request() -> None:
    vad = VoiceActivityDetector()
    assert vad.heard_so_far() is None and vad.audio_so_far() is None and vad.heard_samples == 0
    assert vad.end_turn() is None  # no turn under way
    for chunk in (_tone(0.6), _quiet(0.3)):
        for i in range(0, chunk.size, 320):
            assert vad.push(chunk[i : i + 320]) == []
            heard = vad.heard_so_far()
            assert (heard.size if heard is not None else 0) == vad.heard_samples
    assert vad.pause == pytest.approx(0.3, abs=0.021)
    heard, audio = vad.heard_so_far(), vad.audio_so_far()
    assert heard is not None and audio is not None and audio.size - heard.size == round(vad.pause * RATE)
    ended = vad.end_turn()
    assert ended is not None and np.array_equal(ended, heard)
    assert vad.silence_after == pytest.approx(0.3, abs=0.021) and not vad.speaking and vad.pause == 0.0
