"""Turn-taking: Silero VAD against loudness, a turn ended by the caller's audio stopping, barge-in, latency."""

from __future__ import annotations

import time

import anyio
import numpy as np
import numpy.typing as npt
import pytest

from metronome_engine import KVPolicy
from metronome_sdk import Engine, TimingConfig
from metronome_sdk._audio import resample, without_lead
from metronome_sdk.transports import MemoryTransport
from metronome_sdk.voice import (
    Playback,
    SileroClassifier,
    VoiceActivityDetector,
    VoiceAgent,
    default_turn_detector,
)
from tests.sdk.conftest import make_engine
from tests.webrtc.conftest import FixedSTT, ToneTTS, speak

pytestmark = pytest.mark.timeout(180)
RATE = 16000
PROMPTS = ("What is the capital of France?", "Tell me a short story about a dog.", "How far away is the moon?")


def _turn_end(vad: VoiceActivityDetector, speech: npt.NDArray[np.int16], noise_dbfs: float | None) -> float | None:
    """Seconds from the end of the recording's speech to the turn's end (None: the turn never ended)."""
    lead, tail = np.zeros(RATE // 2), np.zeros(3 * RATE)
    signal = np.concatenate([lead, speech, tail])
    if noise_dbfs is not None:
        signal += np.random.default_rng(0).standard_normal(signal.size) * 32768 * 10 ** (noise_dbfs / 20)
    pcm = np.clip(signal, -32768, 32767).astype(np.int16)
    spoken_until = (lead.size + speech.size) / RATE
    for i in range(0, pcm.size, 320):  # 20 ms frames, as a microphone sends them
        if vad.push(pcm[i : i + 320]):
            return (i + 320) / RATE - spoken_until
    return None


@pytest.mark.parametrize("voice", ["piper", "espeak"])
def test_silero_ends_turns_no_later_than_loudness_and_also_in_noise(voice: str) -> None:
    recordings = [resample(*speak(text, voice=voice), RATE) for text in PROMPTS]
    for noise in (None, -50.0):
        loud = [_turn_end(VoiceActivityDetector(), r, noise) for r in recordings]
        silero = [_turn_end(default_turn_detector(), r, noise) for r in recordings]
        print(f"{voice}, noise {noise} dBFS: loudness {loud}, silero {silero}")
        assert None not in loud and None not in silero
        # one Silero window (32 ms) of granularity per turn; on average no later
        assert all(s <= lo + 0.032 for s, lo in zip(silero, loud, strict=True))  # type: ignore[operator]
        assert sum(silero) <= sum(loud)  # type: ignore[arg-type]
    # steady noise at -40 dBFS is "speech" to loudness, whose turns never end; not to Silero
    assert [_turn_end(VoiceActivityDetector(), r, -40.0) for r in recordings] == [None] * len(recordings)
    ends = [_turn_end(default_turn_detector(), r, -40.0) for r in recordings]
    assert all(e is not None and e < 1.0 for e in ends), ends


def test_silero_classifier_checks_its_settings() -> None:
    with pytest.raises(ValueError, match="threshold"):
        SileroClassifier(threshold=1.5)
    with pytest.raises(ValueError, match="sample_rate=16000"):
        VoiceActivityDetector(sample_rate=8000, classifier=SileroClassifier())
    vad = VoiceActivityDetector(classifier=SileroClassifier())
    assert vad.push(np.zeros(RATE, dtype=np.int16)) == [] and not vad.speaking
    assert vad.flush() is None  # nothing under way
    with pytest.raises(ValueError, match="512 samples"):
        SileroClassifier().is_speech(np.zeros(320, dtype=np.int16))


def _speech_windows(classifier: SileroClassifier, pcm: npt.NDArray[np.int16]) -> list[int]:
    """The indices of the 32 ms windows ``classifier`` calls speech, with a second of silence after ``pcm``."""
    x = np.concatenate([pcm, np.zeros(RATE, dtype=np.int16)])
    return [i for i in range(x.size // 512) if classifier.is_speech(x[i * 512 : (i + 1) * 512])]


def _level(pcm: npt.NDArray[np.int16]) -> float:
    return 20 * float(np.log10(max(float(np.sqrt(np.mean(np.square(pcm, dtype=np.float64)))) / 32768, 1e-5)))


def test_silero_leaves_out_the_faint_tail_of_speech_and_only_that() -> None:
    speech = resample(*speak("What is the capital of France?", voice="espeak"), RATE)
    gated, model = SileroClassifier(), SileroClassifier(tail_db=None)
    assert (gated.tail_db, model.tail_db) == (40.0, None) and "tail_db=40.0" in repr(gated)
    with_gate, alone = _speech_windows(gated, speech), _speech_windows(model, speech)
    assert set(with_gate) <= set(alone)  # the gate only takes windows away
    assert with_gate[-1] < alone[-1]  # the question's speech ends sooner: its faint last sounds are left out
    x = np.concatenate([speech, np.zeros(RATE, dtype=np.int16)])
    peak = max(_level(x[i * 512 : (i + 1) * 512]) for i in alone)
    for i in set(alone) - set(with_gate):  # each one left out is more than 40 dB below the loudest speech
        assert _level(x[i * 512 : (i + 1) * 512]) < peak - 40 + 0.01


def test_silero_gate_follows_the_callers_level_not_a_fixed_one() -> None:
    # a caller 30 dB quieter (a far microphone) peaks near -41 dBFS: a fixed gate at -50 would take
    # most of the question away; the gate relative to the caller's own peak keeps its speech
    speech = resample(*speak("What is the capital of France?", voice="espeak"), RATE)
    quiet = (speech.astype(np.float64) * 10 ** (-30 / 20)).astype(np.int16)
    kept = _speech_windows(SileroClassifier(), quiet)
    alone = _speech_windows(SileroClassifier(tail_db=None), quiet)
    assert alone and len(kept) >= 0.8 * len(alone)
    loud = SileroClassifier()
    _speech_windows(loud, speech)
    loud.reset()  # a new stream forgets the last one's peak: the quiet caller after a loud one keeps its speech
    assert _speech_windows(loud, quiet) == kept


def test_silero_gate_checks_its_setting() -> None:
    for bad in (0, -3, 101, True, "40"):
        with pytest.raises(ValueError, match=r"tail_db must be in \(0, 100\] dB, or None"):
            SileroClassifier(tail_db=bad)  # type: ignore[arg-type]


def test_silero_streams_share_the_model_not_their_state() -> None:
    speech = resample(*speak("What is the capital of France? Paris, I think.", voice="espeak"), RATE)
    windows = [speech[i : i + 512] for i in range(0, speech.size - 512, 512)]
    quiet = np.zeros(512, dtype=np.int16)
    alone = SileroClassifier()
    expected = [alone.probability(w) for w in windows]
    caller, other = SileroClassifier(), SileroClassifier()
    heard = []
    for w in windows:  # another caller's stream, window by window in between, changes nothing
        other.probability(quiet if len(heard) % 2 else w)
        heard.append(caller.probability(w))
    assert heard == expected
    assert max(expected) > 0.5 > min(expected)  # speech and its gaps, not a constant
    caller.reset()
    assert caller.probability(windows[0]) == expected[0]


def test_silero_runs_on_the_calling_thread_alone() -> None:
    # every caller's audio is classified every 32 ms beside the engine's steps: a runtime that
    # wakes threads of its own for each window takes the engine's cores (a step twice as long)
    classifier = SileroClassifier()
    window = (np.random.default_rng(1).standard_normal(512) * 3000).astype(np.int16)
    classifier.is_speech(window)
    process, thread = time.process_time(), time.thread_time()
    for _ in range(300):
        classifier.is_speech(window)
    process, thread = time.process_time() - process, time.thread_time() - thread
    assert thread > 0
    assert process < 1.5 * thread + 0.005, f"process {process:.4f} s of CPU for {thread:.4f} s on this thread"


def _tone(seconds: float) -> npt.NDArray[np.int16]:
    t = np.arange(round(seconds * RATE)) / RATE
    return (8000 * np.sin(2 * np.pi * 300 * t)).astype(np.int16)


class PlayingTransport(MemoryTransport):
    """A memory transport that plays its speech in real time, as WebRTC does: it can be cut (``Playback``)."""

    def __init__(self) -> None:
        super().__init__()
        self.playing_until = 0.0
        self.cuts: list[float] = []

    async def send_audio(self, samples: npt.NDArray[np.int16], sample_rate: int) -> None:
        self.playing_until = max(self.playing_until, time.monotonic()) + samples.size / sample_rate
        await super().send_audio(samples, sample_rate)

    @property
    def queued_audio_seconds(self) -> float:
        return max(0.0, self.playing_until - time.monotonic())

    def clear_audio(self) -> None:
        self.cuts.append(self.queued_audio_seconds)
        self.playing_until = 0.0


class TurnsSTT:
    """Hears one given text per utterance, in order."""

    def __init__(self, *texts: str) -> None:
        self.texts = list(texts)

    def transcribe(self, samples: npt.NDArray[np.int16], sample_rate: int) -> str:
        return self.texts.pop(0) if self.texts else "again"


async def _talk(agent: VoiceAgent, transport: MemoryTransport, script: object) -> list[dict[str, object]]:
    events: list[dict[str, object]] = []

    async def read() -> None:
        async for event in transport.events():
            events.append(event)

    async with anyio.create_task_group() as tg:
        tg.start_soon(read)
        tg.start_soon(script, events)  # type: ignore[arg-type]
        with anyio.fail_after(60):
            await agent.run()
    return events


def _final_answers(events: list[dict[str, object]]) -> list[dict[str, object]]:
    return [e for e in events if e["type"] == "transcript" and e["role"] == "assistant" and e["final"]]


async def ask_twice(agent: VoiceAgent, transport: MemoryTransport, events: list[dict[str, object]]) -> None:
    """Two turns, each answered and spoken before the next, then the caller hangs up."""
    for answers in (1, 2):
        await transport.push_audio(np.concatenate([_tone(0.6), np.zeros(RATE, dtype=np.int16)]), RATE)
        with anyio.fail_after(30):
            while len(_final_answers(events)) < answers or agent.unspoken:
                await anyio.sleep(0.05)
    transport.hang_up()


async def test_a_turn_ends_when_the_callers_audio_ends_with_its_last_word() -> None:
    engine = make_engine()
    await engine.start()
    try:
        async with engine.session("be brief") as session, MemoryTransport() as transport:
            agent = VoiceAgent(session, transport, stt=FixedSTT("hello"), tts=ToneTTS(), max_reply_tokens=6)

            async def script(events: list[dict[str, object]]) -> None:
                await transport.push_audio(np.concatenate([np.zeros(RATE // 4, dtype=np.int16), _tone(0.6)]), RATE)
                transport.hang_up()  # the track ends with the last word: no trailing silence at all

            events = await _talk(agent, transport, script)
    finally:
        await engine.aclose()
    assert {"type": "transcript", "role": "user", "text": "hello", "final": True} in events
    assert _final_answers(events) and _final_answers(events)[0]["text"]
    assert transport.closed


async def test_a_turn_ends_when_no_audio_comes_for_the_turn_gap() -> None:
    engine = make_engine()
    await engine.start()
    try:
        async with engine.session("be brief") as session, MemoryTransport() as transport:
            agent = VoiceAgent(
                session, transport, stt=FixedSTT("hello"), tts=ToneTTS(), max_reply_tokens=4, turn_gap=0.3
            )

            async def script(events: list[dict[str, object]]) -> None:
                await transport.push_audio(_tone(0.6), RATE)  # then nothing: the caller's frames stop
                with anyio.fail_after(30):
                    while not _final_answers(events):
                        await anyio.sleep(0.05)
                transport.hang_up()

            events = await _talk(agent, transport, script)
    finally:
        await engine.aclose()
    assert len(_final_answers(events)) == 1


class QuietLeadTTS(ToneTTS):
    """Like Piper: each sentence starts after 0.1 s of near-silence (a little noise, as a voice's is)."""

    def synthesize(self, text: str) -> tuple[npt.NDArray[np.int16], int]:
        tone, rate = super().synthesize(text)
        lead = np.random.default_rng(len(self.spoken)).integers(-40, 40, rate // 10).astype(np.int16)
        return np.concatenate([lead, tone]), rate


def _lead(chunk: npt.NDArray[np.int16]) -> int:
    return int(np.flatnonzero(np.abs(chunk.astype(np.int32)) > 300)[0])


async def test_the_first_words_of_each_reply_go_out_without_the_voices_lead_in_quiet() -> None:
    engine = make_engine()
    await engine.start()
    tts = QuietLeadTTS(seconds=0.2)
    chunks: list[npt.NDArray[np.int16]] = []
    try:
        async with engine.session("be brief") as session, MemoryTransport() as transport:
            agent = VoiceAgent(session, transport, stt=TurnsSTT("one", "two"), tts=tts, max_reply_tokens=6)

            async def collect() -> None:
                async for chunk in transport.audio():
                    chunks.append(chunk)

            async def script(events: list[dict[str, object]]) -> None:
                async with anyio.create_task_group() as tg:
                    tg.start_soon(collect)
                    await ask_twice(agent, transport, events)

            await _talk(agent, transport, script)
    finally:
        await engine.aclose()
    # the test model's replies are one part each (no clause ends); the voice speaks at the transport's 16 kHz
    assert len(tts.spoken) == len(chunks) == 2
    assert [_lead(c) for c in chunks] == [round(0.01 * RATE)] * 2  # 10 ms of the 100 ms quiet kept
    assert all(round(0.2 * RATE) < c.size <= round(0.21 * RATE) for c in chunks)  # all of the words went out


def test_without_lead_keeps_what_has_no_quiet_to_drop() -> None:
    quiet = np.full(800, 20, dtype=np.int16)
    assert without_lead(quiet, RATE) is quiet  # no words at all: nothing is cut
    loud = _tone(0.1)
    loud[0] = 1000
    assert without_lead(loud, RATE).size == loud.size  # words from the first sample
    both = np.concatenate([np.zeros(RATE // 20, dtype=np.int16), loud])
    assert without_lead(both, RATE).size == loud.size + RATE // 100
    assert without_lead(both, RATE, keep=0.0).size == loud.size


async def test_barge_in_cuts_the_reply_and_the_next_answer_is_to_the_new_turn() -> None:
    engine = make_engine()
    await engine.start()
    tts = ToneTTS(seconds=3.0)  # every sentence plays for 3 s: long enough to talk over
    try:
        async with engine.session("be brief") as session, PlayingTransport() as transport:
            assert isinstance(transport, Playback)
            agent = VoiceAgent(
                session, transport, stt=TurnsSTT("first question", "second question"), tts=tts, max_reply_tokens=8
            )

            async def script(events: list[dict[str, object]]) -> None:
                await transport.push_audio(np.concatenate([_tone(0.6), np.zeros(RATE, dtype=np.int16)]), RATE)
                with anyio.fail_after(30):  # the reply is playing
                    while transport.queued_audio_seconds < 1.0:
                        await anyio.sleep(0.02)
                await transport.push_audio(np.concatenate([_tone(0.6), np.zeros(RATE, dtype=np.int16)]), RATE)
                with anyio.fail_after(30):
                    while len(_final_answers(events)) < 2:
                        await anyio.sleep(0.05)
                transport.hang_up()

            events = await _talk(agent, transport, script)
    finally:
        await engine.aclose()
    assert len(transport.cuts) == 1 and transport.cuts[0] > 0.5  # reply audio was queued, and was cut
    assert agent.interruptions == 1
    interrupted = [e for e in events if e["type"] == "interrupted"]
    assert len(interrupted) == 1 and interrupted[0]["playing"] is True
    heard = [e["text"] for e in events if e["type"] == "transcript" and e["role"] == "user"]
    assert heard == ["first question", "second question"]
    # the second answer comes after the second question was heard
    order = [(e["type"], e.get("role"), e.get("final")) for e in events]
    second_question = events.index({"type": "transcript", "role": "user", "text": "second question", "final": True})
    assert order[-1] != ("transcript", "user", True)
    assert any(e["type"] == "transcript" and e["role"] == "assistant" and e["final"] for e in events[second_question:])


async def _context_after(engine: Engine, *script: str | int) -> int:
    """The context length of a fresh "be brief" session fed ``script``: texts, or that many empty frames."""
    async with engine.session("be brief") as witness:
        for step in script:
            for frame in [step] if isinstance(step, str) else [None] * step:
                await witness.step(frame)
        return witness.stats().num_tokens


async def test_barge_in_while_decoding_keeps_only_the_delivered_tokens_in_the_context() -> None:
    # ticks of 20 ms, one token a frame: the reply is still being decoded when the caller speaks
    timing = TimingConfig(period=0.02, deadline=60.0, max_chunk_tokens=8)
    engine = make_engine(KVPolicy.full(), num_blocks=256, limit=4, timing=timing)
    await engine.start()
    try:
        async with engine.session("be brief") as session, MemoryTransport() as transport:
            agent = VoiceAgent(
                session,
                transport,
                stt=TurnsSTT("first question", "second question"),
                tts=ToneTTS(),
                max_reply_tokens=60,
                decode_tokens=1,
            )

            async def script(events: list[dict[str, object]]) -> None:
                await transport.push_audio(np.concatenate([_tone(0.6), np.zeros(RATE, dtype=np.int16)]), RATE)
                with anyio.fail_after(30):  # a few tokens of the reply are out
                    while sum(e["type"] == "frame" for e in events) < 5:
                        await anyio.sleep(0.005)
                await transport.push_audio(np.concatenate([_tone(0.6), np.zeros(RATE, dtype=np.int16)]), RATE)
                with anyio.fail_after(30):
                    while len(_final_answers(events)) < 2:
                        await anyio.sleep(0.05)
                transport.hang_up()

            events = await _talk(agent, transport, script)
            context = session.stats().num_tokens
        cut = agent.last_cut
        assert cut is not None and cut.trimmed
        [interrupted] = [e for e in events if e["type"] == "interrupted"]
        assert interrupted["decoding"] is True and interrupted["kept_tokens"] == len(cut.kept)
        at = events.index(interrupted)
        second = events.index({"type": "transcript", "role": "user", "text": "second question", "final": True})
        # what the agent received of the first reply, all before the cut: no frame of it came after
        frames = [e for e in events[:second] if e["type"] == "frame"]
        assert all(events.index(e) < at for e in frames) and len(frames) == len(cut.kept) < 60
        pieces = [e["text"] for e in events[:at] if e["type"] == "transcript" and e["role"] == "assistant"]
        assert "".join(map(str, pieces)) == cut.text
        answers = _final_answers(events)
        assert answers[0]["interrupted"] is True and answers[0]["text"] == cut.text.strip()
        assert "interrupted" not in answers[1]  # the second question was answered
        replied = sum(e["type"] == "frame" for e in events[second:])
        # the session holds the first question, the tokens delivered before the cut, the second
        # question and its answer: as long as a session fed exactly that
        assert context == await _context_after(
            engine, "first question", len(cut.kept) - 1, "second question", replied - 1
        )
    finally:
        await engine.aclose()


async def test_each_answer_reports_its_voice_to_voice_latency() -> None:
    engine = make_engine()
    await engine.start()
    try:
        async with engine.session("be brief") as session, MemoryTransport() as transport:
            agent = VoiceAgent(
                session, transport, stt=FixedSTT("hello"), tts=ToneTTS(), max_reply_tokens=6, stats_interval=0.05
            )

            async def script(events: list[dict[str, object]]) -> None:
                await transport.push_audio(np.concatenate([_tone(0.6), np.zeros(RATE, dtype=np.int16)]), RATE)
                with anyio.fail_after(30):
                    while not any(e["type"] == "stats" and e["voice_to_voice"] is not None for e in events):
                        await anyio.sleep(0.05)
                transport.hang_up()

            events = await _talk(agent, transport, script)
    finally:
        await engine.aclose()
    latency = [e for e in events if e["type"] == "latency"]
    assert len(latency) == 1 and agent.latencies
    parts = ("turn_end", "transcribe", "first_token", "first_clause", "synthesize", "send")
    total = latency[0]["voice_to_voice"]
    assert isinstance(total, float) and total > 0
    assert abs(sum(float(latency[0][p]) for p in parts) - total) < 1e-6  # type: ignore[arg-type]
    # memory audio is not paced: the detector's 0.7 s pause is audio time, not wall-clock time
    assert [e["voice_to_voice"] for e in events if e["type"] == "stats"][-1] == total
    breakdown = {p: latency[0][p] for p in ("voice_to_voice", *parts)}
    assert [e["turn"] for e in events if e["type"] == "stats"][-1] == breakdown
    assert all(float(latency[0][p]) >= 0 for p in parts)  # type: ignore[arg-type]


def test_an_utterance_keeps_the_start_of_its_pause_when_told_to() -> None:
    # loudness in 20 ms windows: 0.4 s of tone is speech, then quiet
    tone = (8000 * np.sin(np.arange(int(0.4 * RATE)) * 2 * np.pi * 440 / RATE)).astype(np.int16)
    quiet = np.zeros(320, dtype=np.int16)
    for keep, kept_windows in ((0.0, 0), (0.04, 2)):
        vad = VoiceActivityDetector(end_silence=0.2, keep_pause=keep)
        assert vad.keep_pause == pytest.approx(kept_windows * 0.02)
        vad.push(tone)
        speech = vad.heard_samples
        sizes = []
        for _ in range(5):
            vad.push(quiet)
            sizes.append(vad.heard_samples)
        # the audio heard so far takes in the pause's first windows, then stops growing: a stable key
        assert sizes == [speech + 320 * min(i + 1, kept_windows) for i in range(5)]
        heard = vad.heard_so_far()
        assert heard is not None and heard.size == sizes[-1]
        (utterance,) = vad.push(np.zeros(320 * 10, dtype=np.int16))
        assert utterance.size == speech + 320 * kept_windows and vad.silence_after >= 0.2
    with pytest.raises(ValueError, match="keep_pause"):
        VoiceActivityDetector(keep_pause=-0.1)
