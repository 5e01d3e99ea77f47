"""The voice server admits a caller on the voice-to-voice objective, from the turns it answered."""

from __future__ import annotations

import time

import pytest

from metronome_sdk import Engine
from metronome_sdk.webrtc import ServerConfig
from tests.webrtc.client import Call, answered, offer_sdp, tone
from tests.webrtc.conftest import tiny_server
from tests.webrtc.test_bad_input import _post

pytestmark = pytest.mark.timeout(90)


@pytest.mark.parametrize("objective", [1e-3, 600.0])
async def test_a_caller_past_the_objective_is_told_to_retry_at_once(tiny_engine: Engine, objective: float) -> None:
    async with tiny_server(tiny_engine, voice_objective=objective, busy_retry_after=7.0) as server:
        assert server.voice_admission is not None
        first = Call(speech=tone(0.6))
        try:
            await first.connect(server.url)
            await first.until(lambda: answered(first), 30)
            await first.until(lambda: server.voice_admission.stats()["recent_turns"] == 1, 10)  # type: ignore[union-attr]
            started = time.monotonic()
            status, reply, headers = await _post(server.url, {"sdp": await offer_sdp(), "type": "offer"})
            refused_in = time.monotonic() - started
        finally:
            await first.close()
    if objective > 1:  # every turn fits: the second caller is admitted
        assert status == 200 and reply["type"] == "answer"
        return
    assert (status, reply["error"]) == (503, "voice_objective")
    assert headers["Retry-After"] == "7"
    assert "past the voice-to-voice objective of 0.001 s" in str(reply["message"])
    assert server.voice_admission.stats()["refused"] == 1
    assert tiny_engine.stats().rejected == 0  # refused before the engine was asked: no session was opened
    print(f"refused in {refused_in * 1000:.0f} ms")


def test_the_objective_is_checked() -> None:
    with pytest.raises(ValueError, match="voice_objective must be a number of seconds > 0, or None"):
        ServerConfig(voice_objective=0)
    assert ServerConfig(voice_objective=None).voice_objective is None
    assert ServerConfig().voice_objective == 1.5
