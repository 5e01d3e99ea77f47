"""Headless Chromium opens the demo page, clicks Start, and the page shows a live conversation.

The browser's fake microphone plays an espeak-ng recording. Set ``METRONOME_SCREENSHOT``
to a path to keep a screenshot of the page in use.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from metronome_sdk.voice import EspeakTTS
from metronome_sdk.webrtc import ServerConfig, WebRTCServer
from tests.sdk.conftest import make_engine
from tests.webrtc.cdp import CHROMIUM, Chromium
from tests.webrtc.conftest import FixedSTT, speech_wav

pytestmark = [
    pytest.mark.browser,
    pytest.mark.timeout(120),
    pytest.mark.skipif(
        not CHROMIUM.exists(), reason="needs Debian's chromium at /usr/bin/chromium (apt-get install chromium)"
    ),
]

STATE = """JSON.stringify({
  transcript: demo.transcript, frames: demo.frames.length, stats: demo.stats.length,
  maxLevel: demo.maxLevel, error: demo.error, status: demo.state,
  lines: Array.from(document.querySelectorAll('#transcript p')).map(p => p.textContent),
  energy: document.getElementById('energy').textContent
})"""


async def test_the_demo_page_holds_a_conversation_in_chromium(tmp_path: Path) -> None:
    microphone = speech_wav(tmp_path / "question.wav", silence=4.0)  # the fake microphone loops the file
    engine = make_engine(num_blocks=64, limit=4)
    await engine.start()
    try:
        config = ServerConfig(port=0, max_reply_tokens=16)
        stt = FixedSTT("what is the capital of france")
        async with (
            WebRTCServer(engine, config, stt=stt, tts=EspeakTTS()) as server,
            Chromium(server.url, microphone=microphone, profile=tmp_path / "profile") as browser,
        ):
            await browser.wait_for("document.readyState === 'complete' && !!window.demo", 20)
            await browser.evaluate("document.getElementById('start').click()", gesture=True)
            ready = (
                "demo.transcript.some(t => t.role === 'assistant') && demo.maxLevel > 0.02"
                " && demo.stats.length > 2 || !!demo.error"
            )
            await browser.wait_for(ready, 60)
            state = json.loads(await browser.evaluate(STATE))
            if os.environ.get("METRONOME_SCREENSHOT"):
                await browser.screenshot(Path(os.environ["METRONOME_SCREENSHOT"]))
            await browser.evaluate("document.getElementById('start').click()", gesture=True)  # Stop
            await browser.wait_for("demo.state === 'stopped'", 10)
    finally:
        await engine.aclose()
    assert state["error"] is None, state
    assert {"role": "user", "text": "what is the capital of france"} in state["transcript"]
    assert any(t["role"] == "assistant" and t["text"] for t in state["transcript"])
    assert any(line.startswith("you: ") for line in state["lines"])
    assert any(line.startswith("model: ") for line in state["lines"])
    assert state["frames"] >= 1
    assert state["maxLevel"] > 0.02  # the reply was heard in the page, not silence
    assert stt.heard  # the server heard the browser's microphone
