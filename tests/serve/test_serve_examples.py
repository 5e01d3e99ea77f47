"""The serve and integration programs in ``examples/`` run as their docstrings say, on the real weights."""

from __future__ import annotations

import importlib.util
import re
import warnings
from collections.abc import AsyncIterator
from pathlib import Path
from types import ModuleType

import anyio
import pytest

from metronome_sdk import Engine, EngineConfig, TimingConfig
from metronome_sdk.serve import ChatServer, ServeConfig

pytestmark = [pytest.mark.real_model, pytest.mark.timeout(300)]

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _load(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    with warnings.catch_warnings():  # pipecat imports the stdlib's deprecated audioop
        warnings.filterwarnings("ignore", "'audioop' is deprecated", DeprecationWarning)
        spec.loader.exec_module(module)
    return module


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread: None) -> None:
    """Every test here runs on one torch thread (see tests/conftest.py)."""


@pytest.fixture
async def server() -> AsyncIterator[ChatServer]:
    """What `metronome serve` runs, in this process (the weights are loaded once for all tests)."""
    engine = Engine(EngineConfig(), timing=TimingConfig(max_chunk_tokens=16))
    async with ChatServer(engine, ServeConfig(port=0, max_tokens=32)) as server:
        yield server
    await engine.aclose()


async def test_the_openai_client_example(server: ChatServer, capsys: pytest.CaptureFixture[str]) -> None:
    with anyio.fail_after(200):
        await _load("openai_client").main(server.url)
    printed = capsys.readouterr().out.splitlines()
    assert printed[0].startswith("stream: ") and "Paris" in printed[0]
    assert printed[2].startswith("Which city do I live in? -> ") and "Rome" in printed[2]
    assert server.named_sessions == 0  # the example ended its session
    assert server.engine.stats().used_blocks == 0


async def test_the_livekit_example(server: ChatServer, capsys: pytest.CaptureFixture[str]) -> None:
    example = _load("livekit_agent")
    assert example.agent_session(server.url).llm is not None  # what a worker builds
    with anyio.fail_after(200):
        await example.main(server.url)
    printed = capsys.readouterr().out
    assert "Paris" in printed and "Rome" in printed
    assert server.named_sessions == 0 and server.engine.stats().used_blocks == 0


async def test_the_pipecat_example(capsys: pytest.CaptureFixture[str]) -> None:
    with anyio.fail_after(200):
        await _load("pipecat_bot").main(["What is the capital of France?", "And of Italy?"])
    printed = capsys.readouterr().out
    assert "Paris" in printed and "Rome" in printed
    assert re.fullmatch(r"engine: 1 session, \d+ frames, 0 blocks in use after the call", printed.splitlines()[-1])
