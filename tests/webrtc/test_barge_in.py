"""Barge-in over a real peer connection: the caller talks over the reply, and the reply stops at once.

Where the 200 ms go (loopback, 20 ms frames): the caller's first frames of speech reach the
server's turn detector as soon as each is whole (the server keeps no playout buffer for the
microphone), barge-in needs 60 ms of speech, the reply track's next 20 ms frame is silence,
and it reaches the client a frame later.
"""

from __future__ import annotations

import asyncio

import pytest

from metronome_sdk import Engine
from metronome_sdk.voice import VoiceActivityDetector
from metronome_sdk.webrtc import ServerConfig, WebRTCServer
from tests.webrtc.client import Call, tone
from tests.webrtc.conftest import ToneTTS

pytestmark = pytest.mark.timeout(180)

LOUD = -40.0  # dBFS: the reply tone is far above it, silence far below


class TurnsSTT:
    """Hears "first question", then "second question", then "more"."""

    def __init__(self) -> None:
        self.texts = ["first question", "second question"]

    def transcribe(self, samples: object, sample_rate: int) -> str:
        return self.texts.pop(0) if self.texts else "more"


async def test_talking_over_the_reply_stops_its_audio_within_200_ms(tiny_engine: Engine) -> None:
    config = ServerConfig(port=0, max_reply_tokens=12)
    tts = ToneTTS(seconds=4.0)  # each sentence plays for 4 s: plenty to talk over
    async with WebRTCServer(tiny_engine, config, stt=TurnsSTT(), tts=tts, vad=VoiceActivityDetector) as server:
        # aiortc's playout buffer holds reply audio back 80 ms (a browser's adapts: tens of ms on loopback);
        # it is the client's own, so this client measures without it
        call = Call(speech=tone(0.6), playout_buffer=False)
        try:
            await call.connect(server.url)
            await call.until(lambda: call.loud_seconds > 0.5, 30)  # the reply has been playing for 0.5 s
            spoke_at = call.microphone.say(tone(0.6))
            await call.until(lambda: bool(call.of_type("interrupted")), 10)
            await asyncio.sleep(0.5)
            stopped_at = next(t for t, level in call.levels if t > spoke_at and level < LOUD)
            assert all(level < LOUD for t, level in call.levels if stopped_at <= t)  # and it stayed stopped
            await call.until(lambda: [e["text"] for e in call.of_type("transcript")].count("second question") == 1, 20)
            second = call.events.index({"type": "transcript", "role": "user", "text": "second question", "final": True})
            await call.until(
                lambda: any(e["type"] == "transcript" and e["role"] == "assistant" for e in call.events[second:]), 20
            )
        finally:
            await call.close()
    print(f"the reply stopped {1000 * (stopped_at - spoke_at):.0f} ms after the caller started talking over it")
    assert stopped_at - spoke_at <= 0.2
    assert call.of_type("interrupted")[0]["playing"] is True
    first_answer = [e for e in call.events[:second] if e["type"] == "transcript" and e["role"] == "assistant"]
    assert first_answer  # the first turn was answered, then cut while it played
