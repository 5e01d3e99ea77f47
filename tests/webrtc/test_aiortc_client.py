"""A real aiortc client talks to the demo server, with its default voice, over a real peer connection on loopback.

Its microphone plays Piper saying the question, and its track ends with the question's last
word (as a file player's does: no trailing silence for a turn detector to wait for). The
server hears it with Whisper, the SmolLM2 model answers, Piper speaks the answer, and the
client receives that speech and the events (transcripts both ways, per-frame metrics, latency).
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest

from metronome_sdk.webrtc import ServerConfig, WebRTCServer, demo_engine
from tests.webrtc.client import Call, answered, read_wav
from tests.webrtc.conftest import speech_wav

pytestmark = [pytest.mark.real_model, pytest.mark.timeout(150)]


def words(text: str) -> str:
    return " ".join(re.sub(r"[^a-z0-9' ]", " ", text.lower()).split())


async def test_a_question_whose_track_ends_with_its_last_word_gets_a_spoken_answer(tmp_path: Path) -> None:
    wav = speech_wav(tmp_path / "question.wav", "What is the capital of France?", silence=0.0)
    t0 = time.monotonic()
    async with demo_engine() as engine, WebRTCServer(engine, ServerConfig(port=0, max_reply_tokens=24)) as server:
        loaded = time.monotonic() - t0
        call = Call(speech=read_wav(wav), track_ends=True)
        try:
            await call.connect(server.url)
            await call.until(lambda: answered(call) and call.loud_seconds > 0.5, 60)
        finally:
            await call.close()
        talked = time.monotonic() - t0 - loaded
    kinds = {e["type"] for e in call.events}
    assert {"ready", "state", "transcript", "frame", "stats", "latency"} <= kinds
    heard = [e["text"] for e in call.of_type("transcript") if e["role"] == "user"]
    assert [words(h) for h in heard] == ["what is the capital of france"]
    reply = [e["text"] for e in call.of_type("transcript") if e["role"] == "assistant" and e["final"]]
    assert reply and "paris" in reply[0].lower()
    frames = call.of_type("frame")
    assert len(frames) >= 2
    assert all(f["latency"] > 0 and f["deadline"] == engine.timing.frame_deadline for f in frames)
    assert call.max_dbfs > -30.0  # the reply is speech, not silence
    assert not call.of_type("error")
    latency = call.of_type("latency")[0]
    print(
        f"model ready in {loaded:.1f} s; heard {heard[0]!r}; answered {reply[0]!r} in {talked:.1f} s; "
        f"voice-to-voice {latency['voice_to_voice']:.2f} s ({latency})"
    )
