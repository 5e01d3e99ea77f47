"""A real aiortc client talks to the demo server over a real peer connection on loopback.

Its microphone is an espeak-ng recording; the server hears it with pocketsphinx, the
SmolLM2 model answers with its chat template, espeak-ng speaks the answer, and the
client receives that speech and the events (transcripts both ways, per-frame metrics).
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from metronome_sdk.voice import EspeakTTS, PocketSphinxSTT
from metronome_sdk.webrtc import ServerConfig, WebRTCServer, demo_engine
from tests.webrtc.client import Call, answered, read_wav
from tests.webrtc.conftest import speech_wav

pytestmark = [pytest.mark.real_model, pytest.mark.timeout(120)]


async def test_a_spoken_question_gets_a_spoken_answer_and_transcripts(tmp_path: Path) -> None:
    wav = speech_wav(tmp_path / "question.wav")
    t0 = time.monotonic()
    async with (
        demo_engine() as engine,
        WebRTCServer(
            engine, ServerConfig(port=0, max_reply_tokens=24), stt=PocketSphinxSTT(), tts=EspeakTTS()
        ) as server,
    ):
        loaded = time.monotonic() - t0
        call = Call(speech=read_wav(wav))
        try:
            await call.connect(server.url)
            # the question plays for about 3 s; the answer must be heard well within the bound
            await call.until(lambda: answered(call) and call.loud_seconds > 0.5, 45)
        finally:
            await call.close()
        talked = time.monotonic() - t0 - loaded
    kinds = {e["type"] for e in call.events}
    assert {"ready", "state", "transcript", "frame", "stats"} <= kinds
    heard = [e["text"] for e in call.of_type("transcript") if e["role"] == "user"]
    assert heard and heard[0].strip()  # pocketsphinx heard words (its small model is not accurate)
    reply = [e["text"] for e in call.of_type("transcript") if e["role"] == "assistant" and e["final"]]
    assert reply and len(reply[0]) > 2
    frames = call.of_type("frame")
    assert len(frames) >= 2
    assert all(f["latency"] > 0 and f["deadline"] == engine.timing.frame_deadline for f in frames)
    assert call.max_dbfs > -30.0  # the reply is speech, not silence
    assert not call.of_type("error")
    print(f"model ready in {loaded:.1f} s; heard {heard[0]!r}; answered {reply[0]!r} in {talked:.1f} s")
