"""The embedded voice and the in-memory transport: turn-taking, the reply, the real espeak-ng and pocketsphinx."""

from __future__ import annotations

import math
import shutil
import time
from fractions import Fraction
from typing import Any

import anyio
import numpy as np
import numpy.typing as npt
import pytest
from aiortc.mediastreams import MediaStreamError

from metronome_engine import KVPolicy
from metronome_sdk import CacheExhausted, EngineStalled, OutputFrame, Session, TickReport, TimingConfig
from metronome_sdk._session import FrameLike
from metronome_sdk.transports import MemoryTransport, Transport
from metronome_sdk.voice import EspeakTTS, PocketSphinxSTT, VoiceActivityDetector, VoiceAgent
from metronome_sdk.webrtc import ReplyAudioTrack, WebRTCPeer
from tests.sdk.conftest import make_engine
from tests.webrtc.conftest import FixedSTT, ToneTTS

pytestmark = pytest.mark.timeout(60)
RATE = 16000


def _tone(seconds: float, amplitude: float = 8000.0) -> npt.NDArray[np.int16]:
    t = np.arange(round(seconds * RATE)) / RATE
    return (amplitude * np.sin(2 * np.pi * 300 * t)).astype(np.int16)


def _quiet(seconds: float) -> npt.NDArray[np.int16]:
    return np.zeros(round(seconds * RATE), dtype=np.int16)


def test_voice_activity_ends_a_turn_after_a_pause_and_keeps_its_first_syllable() -> None:
    vad = VoiceActivityDetector(end_silence=0.5, pre_roll=0.2)
    assert vad.push(_quiet(1.0)) == []
    assert vad.push(_tone(0.8)) == []
    assert vad.speaking
    assert vad.push(_quiet(0.3)) == []  # a short pause is not the end of the turn
    assert vad.push(_tone(0.4)) == []
    done = vad.push(_quiet(0.6))
    assert len(done) == 1
    seconds = done[0].size / RATE
    assert 0.8 + 0.3 + 0.4 <= seconds <= 0.8 + 0.3 + 0.4 + 0.2 + 0.05  # the speech, the pause, the pre-roll
    assert not vad.speaking


def test_voice_activity_ignores_clicks_and_quiet_noise() -> None:
    vad = VoiceActivityDetector(min_speech=0.2)
    rng = np.random.default_rng(0)
    noise = (rng.standard_normal(RATE * 2) * 50).astype(np.int16)  # about -56 dBFS
    assert vad.push(noise) == []
    assert vad.push(np.concatenate([_tone(0.06), _quiet(1.0)])) == []  # a 60 ms click
    assert not vad.speaking


def test_voice_activity_rejects_bad_settings() -> None:
    with pytest.raises(ValueError, match="threshold_db"):
        VoiceActivityDetector(threshold_db=3.0)
    with pytest.raises(ValueError, match="max_utterance"):
        VoiceActivityDetector(end_silence=2.0, max_utterance=1.0)


async def test_the_transports_fit_the_protocol() -> None:
    async with MemoryTransport() as transport:
        assert isinstance(transport, Transport)
    assert issubclass(WebRTCPeer, Transport)


async def test_a_voice_agent_answers_a_turn_through_the_memory_transport() -> None:
    engine = make_engine()
    stt, tts = FixedSTT("hello"), ToneTTS()
    await engine.start()
    try:
        async with engine.session("be brief") as session, MemoryTransport() as transport:
            agent = VoiceAgent(session, transport, stt=stt, tts=tts, max_reply_tokens=6)
            events: list[dict[str, object]] = []
            speech: list[npt.NDArray[np.int16]] = []

            async def read() -> None:
                async for event in transport.events():
                    events.append(event)
                    if event["type"] == "transcript" and event["role"] == "assistant" and event["final"]:
                        async for chunk in transport.audio():
                            speech.append(chunk)
                            break
                        transport.hang_up()

            async with anyio.create_task_group() as tg:
                tg.start_soon(read)
                await transport.push_audio(np.concatenate([_quiet(0.3), _tone(0.6), _quiet(1.0)]), RATE)
                with anyio.fail_after(20):
                    await agent.run()  # returns when the peer hangs up
                await transport.aclose()
    finally:
        await engine.aclose()
    kinds = [e["type"] for e in events]
    assert kinds[:2] == ["ready", "state"]
    assert stt.heard and abs(stt.heard[0] / RATE - 0.8) < 0.15  # the tone plus pre-roll: one utterance
    assert {"type": "transcript", "role": "user", "text": "hello", "final": True} in events
    frames = [e for e in events if e["type"] == "frame"]
    assert 1 <= len(frames) <= 6
    assert all(isinstance(f["latency"], float) and f["latency"] > 0 and f["deadline"] == 60.0 for f in frames)
    assert [f["index"] for f in frames] == list(range(len(frames)))
    final = [e for e in events if e["type"] == "transcript" and e["role"] == "assistant" and e["final"]]
    assert final and final[0]["text"]
    assert tts.spoken and "".join(tts.spoken).replace(" ", "") == str(final[0]["text"]).replace(" ", "")
    assert speech and np.abs(speech[0]).max() > 1000
    stats = [e for e in events if e["type"] == "stats"]
    assert stats and stats[0]["pool_blocks"] == 64 and stats[0]["limit"] >= 1


class BeatSession(Session):
    """A session that notes, as each frame is sent, the time and when the engine's next tick may start."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.sent: list[tuple[float, float | None]] = []

    async def step(self, frame: FrameLike = None) -> OutputFrame:
        assert self.engine is not None
        self.sent.append((anyio.current_time(), self.engine.next_tick))
        return await super().step(frame)


@pytest.mark.parametrize("beat_lead", [0.01, None])
async def test_a_voice_agent_sends_each_reply_frame_just_before_the_tick_that_takes_it(beat_lead: float | None) -> None:
    # a long period: a frame sent at once after the last output waits most of it for the next tick
    period = 0.3
    engine = make_engine(timing=TimingConfig(period=period, deadline=60.0, max_chunk_tokens=64))
    await engine.start()
    assert engine.next_tick is None  # no tick yet
    try:
        async with BeatSession("be brief", engine=engine) as session, MemoryTransport() as transport:
            agent = VoiceAgent(
                session, transport, stt=FixedSTT("hi"), tts=ToneTTS(), max_reply_tokens=4, beat_lead=beat_lead
            )

            await _one_turn(agent, transport)
    finally:
        await engine.aclose()
    replies = session.sent[1:]  # the turn's first frame follows the transcription, not a tick
    assert len(replies) >= 2 and all(tick is not None for _, tick in replies)
    early = [tick - now for now, tick in replies if tick is not None]
    if beat_lead is not None:  # never sent sooner than beat_lead before the tick (the clock's resolution aside)
        assert all(e <= beat_lead + 1e-3 for e in early), early
    else:  # sent at once: each waited most of a period for the tick
        assert all(e > period / 2 for e in early), early


async def test_a_voice_agent_gives_the_question_ahead_so_every_frame_appends_one_token() -> None:
    # a frame carrying the whole question is a step as long as the question (the demo's one late
    # frame); appended ahead (Session.append), the question's tokens go in ticks with no frame
    reports: list[TickReport] = []
    engine = make_engine(
        KVPolicy.full(), num_blocks=128, timing=TimingConfig(period=0.001, deadline=60.0), on_tick=reports.append
    )
    question = "what is the capital of france"
    async with engine, engine.session("be brief") as session, MemoryTransport() as transport:
        agent = VoiceAgent(session, transport, stt=FixedSTT(question), tts=ToneTTS(), max_reply_tokens=5)

        await _one_turn(agent, transport)
        stats = session.stats()
    framed = [r.tokens for r in reports if r.latencies]
    # the question's last token, then each reply token fed back (up to 5, fewer if the model stops)
    assert stats.frames >= 1 and framed == [1] * stats.frames, framed
    assert sum(r.tokens for r in reports if not r.latencies) >= len(question)  # the prompt and the question
    assert stats.turns == 1


async def test_a_voice_agent_refuses_a_bad_beat_lead() -> None:
    engine = make_engine()
    await engine.start()
    try:
        async with engine.session() as session, MemoryTransport() as transport:
            for bad in (-0.01, 1.5, math.nan):
                with pytest.raises(ValueError, match="beat_lead"):
                    VoiceAgent(session, transport, stt=FixedSTT(), tts=ToneTTS(), beat_lead=bad)
    finally:
        await engine.aclose()


async def test_a_voice_agent_reports_a_stall_then_hangs_up() -> None:
    engine = make_engine(KVPolicy.full(), num_blocks=6, block_size=4)
    await engine.start()
    try:
        prompt = "a system prompt far too long for this pool"
        async with engine.session(prompt) as session, MemoryTransport() as transport:
            agent = VoiceAgent(session, transport, stt=FixedSTT(), tts=ToneTTS())
            await transport.push_audio(np.concatenate([_tone(0.6), _quiet(1.0)]), RATE)
            with anyio.fail_after(20), pytest.raises((EngineStalled, CacheExhausted)) as failed:
                await agent.run()
            events = [e async for e in transport.events()]  # the transport was closed: this ends
    finally:
        await engine.aclose()
    assert transport.closed
    assert events[-2]["type"] == "error" and events[-2]["error"] == type(failed.value).__name__
    assert events[-1] == {"type": "closed", "reason": type(failed.value).__name__}


async def test_the_reply_track_is_paced_in_real_time_and_ends_when_stopped() -> None:
    track = ReplyAudioTrack(sample_rate=48000, frame_seconds=0.02)
    track.enqueue(_tone(0.05), RATE)  # 50 ms of speech, then silence
    start = time.monotonic()
    frames = [await track.recv() for _ in range(10)]
    elapsed = time.monotonic() - start
    assert 0.16 <= elapsed <= 0.5  # nine frame periods after the first
    assert [f.pts for f in frames] == [960 * i for i in range(10)]
    assert all(f.time_base == Fraction(1, 48000) and f.sample_rate == 48000 and f.samples == 960 for f in frames)
    loud = [int(np.abs(f.to_ndarray()).max()) for f in frames]
    assert all(v > 1000 for v in loud[:2]) and all(v == 0 for v in loud[3:])
    track.stop()
    with pytest.raises(MediaStreamError):
        await track.recv()


async def test_a_reply_with_a_lead_goes_out_back_to_back_then_the_lead_is_given_back() -> None:
    track = ReplyAudioTrack(sample_rate=48000, frame_seconds=0.02, lead=0.08)
    paced = ReplyAudioTrack(sample_rate=48000, frame_seconds=0.02)
    frames = []
    for t in (track, paced):
        for _ in range(3):  # quiet: paced on the wall clock, nothing ahead
            frames.append(await t.recv())
        assert t.ahead == 0.0
        t.enqueue(_tone(0.3), RATE)
        speech = math.ceil(round(t.queued_seconds * 48000) / 960)  # frames
        start = time.monotonic()
        for _ in range(4):
            frames.append(await t.recv())
        if t is track:  # the reply's first four frames went out at once (paced, they take three periods)
            assert time.monotonic() - start < 0.05
            assert track.ahead == 0.08
        else:
            assert time.monotonic() - start >= 0.06
    for _ in range(speech - 4):  # the rest of the speech
        frames.append(await track.recv())
    assert track.ahead == 0.08
    for _ in range(10):
        frames.append(await track.recv())
    assert track.ahead == pytest.approx(0.08 - 10 * 0.001)  # a millisecond of each quiet frame's 20
    pts = [f.pts for f in frames[:7]] + [f.pts for f in frames[14:]]
    assert pts == [960 * i for i in range(3 + speech + 10)]  # no frame skipped
    with pytest.raises(ValueError, match="lead must be seconds in"):
        ReplyAudioTrack(lead=-0.1)


@pytest.mark.skipif(shutil.which("espeak-ng") is None, reason="espeak-ng is not installed (apt-get install espeak-ng)")
def test_espeak_speaks_and_pocketsphinx_hears_words() -> None:
    samples, rate = EspeakTTS().synthesize("Hello. What is the capital of France?")
    assert rate == 22050
    assert samples.dtype == np.int16 and 1.0 < samples.size / rate < 6.0
    assert np.abs(samples).max() > 3000
    text = PocketSphinxSTT().transcribe(samples, rate)
    assert len(text.split()) >= 2  # a small model: words, not necessarily these words


def test_espeak_tts_names_the_fix_when_the_program_is_missing() -> None:
    with pytest.raises(FileNotFoundError, match="apt-get install espeak-ng"):
        EspeakTTS(executable="no-such-espeak")


async def _one_turn(agent: VoiceAgent, transport: MemoryTransport) -> None:
    """One spoken turn (a tone, then quiet) through ``agent``, hanging up at the final reply."""

    async def read() -> None:
        async for event in transport.events():
            if event["type"] == "transcript" and event["role"] == "assistant" and event["final"]:
                transport.hang_up()

    async with anyio.create_task_group() as tg:
        tg.start_soon(read)
        await transport.push_audio(np.concatenate([_tone(0.6), _quiet(1.0)]), RATE)
        with anyio.fail_after(20):
            await agent.run()
        await transport.aclose()
