"""The programs in ``examples/`` run as their docstrings say, on the real SmolLM2 weights and the embedded voice."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import urllib.request
import wave
from pathlib import Path
from types import ModuleType

import anyio
import pytest

from tests.webrtc.client import Call, answered, read_wav
from tests.webrtc.conftest import speech_wav

pytestmark = [pytest.mark.real_model, pytest.mark.timeout(180)]

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
TESTED = {"voice_agent.py", "webrtc_server.py"}  # each has a test below
# the serve and integration examples are run by tests/serve/test_serve_examples.py
TESTED |= {"openai_client.py", "pipecat_bot.py", "livekit_agent.py"}
# the Realtime clients: tests/serve/test_realtime_clients.py (tiny engine), test_realtime_real.py (real voice)
TESTED |= {"realtime_clients.py"}
TOKEN = "example-token"


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread: None) -> None:
    """Every test here runs on one torch thread (see tests/conftest.py)."""


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_example_is_tested() -> None:
    assert {p.name for p in EXAMPLES.glob("*.py")} == TESTED


async def test_the_voice_agent_example_hears_a_question_and_speaks_an_answer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    example = _load("voice_agent")
    out = tmp_path / "reply.wav"
    with anyio.fail_after(120):
        await example.main("What is the capital of France?", str(out))
    printed = capsys.readouterr().out
    assert "     user: What is the capital of France?" in printed  # Whisper heard Piper's words
    assert "assistant: " in printed
    assert "    frame   0: " in printed and "    error " not in printed and "    voice-to-voice " in printed
    assert printed.splitlines()[-1] == f"the agent's spoken answer: {out}"
    with wave.open(str(out)) as w:
        assert w.getframerate() == 16000 and w.getnframes() > 16000 // 4  # some speech, not an empty file


async def test_the_webrtc_server_example_answers_a_call_and_stops_on_ctrl_c(tmp_path: Path) -> None:
    question = read_wav(speech_wav(tmp_path / "question.wav"))
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "METRONOME_TOKEN": TOKEN}
    proc = subprocess.Popen(
        [sys.executable, str(EXAMPLES / "webrtc_server.py"), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        with anyio.fail_after(90):
            line = await anyio.to_thread.run_sync(proc.stdout.readline)  # once the model and the socket are ready
        assert line.startswith("open http://127.0.0.1:") and line.rstrip().endswith("and press Start (Ctrl-C stops)")
        url = line.split()[1]
        with urllib.request.urlopen(url, timeout=10) as resp:
            assert resp.status == 200
        call = Call(speech=question)
        try:
            await call.connect(url, token=TOKEN)
            await call.until(lambda: answered(call), 60)
        finally:
            await call.close()
        proc.send_signal(signal.SIGINT)
        await anyio.to_thread.run_sync(lambda: proc.communicate(timeout=30))
    finally:
        if proc.poll() is None:
            proc.kill()
        _, err = proc.communicate()  # what the first call read, or the rest after a kill
    heard = [e["text"] for e in call.of_type("transcript") if e["role"] == "user"]
    assert heard and heard[0].endswith(", please")  # the example's own recognizer wrapped Whisper
    assert not call.of_type("error")
    assert proc.returncode == 0, err
    assert "Traceback" not in err
