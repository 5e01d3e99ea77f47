"""Headless Chromium opens the demo page, clicks Start, and holds a conversation with the default voice.

The browser's fake microphone plays Piper saying "What is the capital of France?" (made now,
not committed); the server hears it with Whisper, SmolLM2 answers, Piper speaks the answer.
Set ``METRONOME_SCREENSHOT`` to a path to keep a screenshot of the page in use.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from metronome_bench.eval.voice import word_errors
from metronome_sdk.webrtc import ServerConfig, WebRTCServer, demo_engine
from tests.webrtc.cdp import CHROMIUM, Chromium
from tests.webrtc.conftest import speech_wav

pytestmark = [pytest.mark.browser, pytest.mark.real_model, pytest.mark.timeout(240)]

STATE = """JSON.stringify({
  transcript: demo.transcript, frames: demo.frames.length, stats: demo.stats, latencies: demo.latencies,
  maxLevel: demo.maxLevel, error: demo.error, status: demo.state,
  lines: Array.from(document.querySelectorAll('#transcript p')).map(p => p.textContent),
  v2v: document.getElementById('v2v').textContent
})"""


def words(text: str) -> str:
    return " ".join(re.sub(r"[^a-z0-9' ]", " ", text.lower()).split())


async def test_the_demo_page_answers_a_spoken_question_in_chromium(tmp_path: Path) -> None:
    if not CHROMIUM.exists():  # `make test-browser` installs it: missing here is a failure, not a skip
        pytest.fail(f"no {CHROMIUM}: run `make test-browser` (it installs Debian's chromium)")
    # the fake microphone plays from the start of capture, before the call is connected, and loops the
    # file: 3 s of quiet (the call connects), the question, 6 s of quiet (the answer)
    microphone = speech_wav(tmp_path / "question.wav", "What is the capital of France?", lead=3.0, silence=6.0)
    async with (
        demo_engine() as engine,
        WebRTCServer(engine, ServerConfig(port=0, max_reply_tokens=24)) as server,
        Chromium(server.url, microphone=microphone, profile=tmp_path / "profile") as browser,
    ):
        await browser.wait_for("document.readyState === 'complete' && !!window.demo", 20)
        await browser.evaluate("document.getElementById('start').click()", gesture=True)
        ready = (
            "demo.transcript.some(t => t.role === 'assistant') && demo.latencies.length > 0"
            " && demo.stats.some(s => s.voice_to_voice !== null) && demo.maxLevel > 0.02 || !!demo.error"
        )
        await browser.wait_for(ready, 150)
        state = json.loads(await browser.evaluate(STATE))
        if os.environ.get("METRONOME_SCREENSHOT"):
            await browser.screenshot(Path(os.environ["METRONOME_SCREENSHOT"]))
        await browser.evaluate("document.getElementById('start').click()", gesture=True)  # Stop
        await browser.wait_for("demo.state === 'stopped'", 10)
    assert state["error"] is None, state
    heard = [t["text"] for t in state["transcript"] if t["role"] == "user"]
    # The recognizer is not what this checks (`metronome eval voice` does): tiny.en hears a take of this
    # question through Opus as "... capital of friends" about 3 times in 96 (Piper's takes x gain, noise,
    # bit rate and frame offset, measured 2026-12-06), and CI met one. One word wrong passes; Paris is
    # asked of the answer when France was heard.
    assert word_errors("What is the capital of France?", heard[0]) <= 1, heard
    answer = next(t["text"] for t in state["transcript"] if t["role"] == "assistant")
    assert answer.strip(), state["transcript"]
    if "france" in words(heard[0]):
        assert "paris" in answer.lower(), answer
    assert any(line.startswith("you: ") for line in state["lines"])
    assert any(line.startswith("model: ") for line in state["lines"])
    assert state["frames"] >= 1
    assert state["maxLevel"] > 0.02  # the reply was heard in the page, not silence
    v2v = state["latencies"][0]["voice_to_voice"]
    assert state["v2v"] == f"{v2v * 1e3:.0f}"  # shown on the page
    assert any(s["voice_to_voice"] is not None for s in state["stats"])  # and in the stats event
    last = state["stats"][-1]  # the frame latency a user sees (docs/webrtc.md reports it with the machine)
    print(f"heard {heard[0]!r}; answered {answer!r}; voice-to-voice {v2v:.2f} s: {state['latencies'][0]}")
    print(
        f"frames p50 {last['latency_p50']} s, p95 {last['latency_p95']} s, deadline {last['deadline']} s, "
        f"deadline misses {last['deadline_misses']}, cap {last['limit']}"
    )
