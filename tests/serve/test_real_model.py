"""``metronome serve`` and the integrations on the real SmolLM2 weights, through the real clients."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import warnings
from collections.abc import AsyncIterator

import anyio
import openai
import pytest

from metronome_sdk import Engine, EngineConfig, TimingConfig
from metronome_sdk.serve import ChatServer, ServeConfig
from tests.serve.load import run_load

pytestmark = [pytest.mark.real_model, pytest.mark.timeout(300)]

FRANCE = [{"role": "user", "content": "What is the capital of France?"}]
BRIEF = {"role": "system", "content": "Answer in one short sentence."}


@pytest.fixture
async def real_engine() -> AsyncIterator[Engine]:
    # short prefill chunks, as `metronome serve` runs it: a turn never holds the metronome long
    engine = Engine(EngineConfig(), timing=TimingConfig(max_chunk_tokens=16))
    await engine.start()
    yield engine
    await engine.aclose()


async def test_the_openai_client_streams_paris(real_engine: Engine) -> None:
    async with (
        ChatServer(real_engine, ServeConfig(port=0, max_tokens=24)) as server,
        openai.AsyncOpenAI(base_url=server.url, api_key="unused") as client,
    ):
        stream = await client.chat.completions.create(model="metronome", messages=FRANCE, stream=True)
        chunks = [c async for c in stream]
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "Paris" in text, text
    assert chunks[-1].choices[0].finish_reason == "stop"


@pytest.mark.slow  # a fresh process loads the model: a minute or two on a busy 2-core machine
async def test_the_serve_command_streams_paris_to_the_openai_client() -> None:
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "metronome_sdk.cli", "serve", "--port", "0", "--max-tokens", "24"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        with anyio.fail_after(240):
            line = await anyio.to_thread.run_sync(proc.stdout.readline)  # once the model and the socket are ready
        assert line.startswith("serving http://127.0.0.1:"), line
        url = line.split()[1]
        async with openai.AsyncOpenAI(base_url=url, api_key="unused") as client:
            stream = await client.chat.completions.create(model="metronome", messages=FRANCE, stream=True)
            text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        proc.send_signal(signal.SIGINT)
        await anyio.to_thread.run_sync(lambda: proc.communicate(timeout=30))
    finally:
        if proc.poll() is None:
            proc.kill()
        _, err = proc.communicate()
    assert "Paris" in text, text
    assert proc.returncode == 0, err
    assert "Traceback" not in err


async def test_a_session_key_keeps_the_context_across_requests(real_engine: Engine) -> None:
    async with (
        ChatServer(real_engine, ServeConfig(port=0, max_tokens=20)) as server,
        openai.AsyncOpenAI(base_url=server.url, api_key="unused") as client,
    ):
        key = {"X-Metronome-Session": "rome"}
        said = [BRIEF, {"role": "user", "content": "I live in Rome."}]
        first = await client.chat.completions.create(model="m", messages=said, extra_headers=key)
        asked = [
            *said,
            {"role": "assistant", "content": first.choices[0].message.content or ""},
            {"role": "user", "content": "Which city do I live in?"},
        ]
        keyed = await client.chat.completions.create(model="m", messages=asked, extra_headers=key)
        await client.delete("/sessions/rome", cast_to=object)  # its place under the cap (maybe 1 here) is free
        alone = await client.chat.completions.create(model="m", messages=[BRIEF, asked[-1]])
    assert "Rome" in (keyed.choices[0].message.content or "")  # the session remembered
    assert "Rome" not in (alone.choices[0].message.content or "")  # the model does not guess it without
    assert real_engine.stats().sessions == 0 and real_engine.stats().used_blocks == 0


@pytest.mark.slow
@pytest.mark.timeout(900)
async def test_a_named_session_runs_200_turns_with_its_blocks_bounded(real_engine: Engine) -> None:
    bound = real_engine.core.session_bound_blocks(chunk=real_engine.timing.max_chunk_tokens)
    assert bound is not None
    used: list[int] = []
    async with (
        ChatServer(real_engine, ServeConfig(port=0, max_tokens=8)) as server,
        openai.AsyncOpenAI(base_url=server.url, api_key="unused") as client,
    ):
        key = {"X-Metronome-Session": "long-call"}
        for turn in range(200):
            # only the new turn: the session holds the rest
            messages = [BRIEF, {"role": "user", "content": f"Turn {turn}: tell me one fact about the sea."}]
            reply = await client.chat.completions.create(model="m", messages=messages, extra_headers=key)
            assert reply.choices[0].message.content
            used.append(real_engine.stats().used_blocks)
        assert real_engine.stats().admitted == 1  # one session for all 200 turns
    print(f"blocks in use over 200 turns: first {used[0]}, max {max(used)}, last {used[-1]}; bound {bound}")
    assert max(used) <= bound  # the window holds: the context does not grow with the turns
    assert used[-1] <= max(used[:50])  # it plateaued early
    assert real_engine.stats().used_blocks == 0


async def test_a_pipecat_pipeline_answers_two_turns_on_the_real_model(real_engine: Engine) -> None:
    with warnings.catch_warnings():  # pipecat's audio helpers import the stdlib's deprecated audioop
        warnings.filterwarnings("ignore", "'audioop' is deprecated", DeprecationWarning)
        from metronome_sdk.integrations.pipecat import MetronomeLLMService
        from tests.serve.test_pipecat import Bot

    llm = MetronomeLLMService(engine=real_engine, system_prompt=BRIEF["content"], max_tokens=24)
    async with Bot(llm) as bot:
        await bot.say("What is the capital of France?")
        await bot.until(lambda: len(bot.replies()) == 1, 120)
        bot.remember(bot.replies()[0])
        await bot.say("And what is the capital of Italy?")
        await bot.until(lambda: len(bot.replies()) == 2, 120)
    first, second = bot.replies()
    assert "Paris" in first, first
    assert "Rome" in second, second
    assert real_engine.stats().used_blocks == 0


async def test_pipelines_given_no_engine_share_one_that_closes_with_the_last() -> None:
    with warnings.catch_warnings():  # pipecat's audio helpers import the stdlib's deprecated audioop
        warnings.filterwarnings("ignore", "'audioop' is deprecated", DeprecationWarning)
        from metronome_sdk.integrations.pipecat import MetronomeLLMService, SharedEngine
        from tests.serve.test_pipecat import Bot

    bots = [Bot(MetronomeLLMService(system_prompt=BRIEF["content"], max_tokens=24)) for _ in range(2)]
    async with bots[0], bots[1]:
        await bots[0].until(lambda: SharedEngine.current() is not None, 30)  # the pipelines are starting
        shared = SharedEngine.current()
        assert shared is not None  # made by the first service to start, the default model
        for bot in bots:
            await bot.say("What is the capital of France?")
        for bot in bots:
            await bot.until(lambda bot=bot: len(bot.replies()) == 1, 180)
        assert shared.stats().admitted == 2 and shared.stats().sessions == 2  # one engine, both calls
    assert all("Paris" in bot.replies()[0] for bot in bots), [bot.replies() for bot in bots]
    assert shared.closed and SharedEngine.current() is None  # closed with the last pipeline


@pytest.mark.slow
@pytest.mark.timeout(600)
async def test_four_times_the_cap_of_streams_for_a_minute_complete_or_get_429(real_engine: Engine) -> None:
    report = await run_load(real_engine, seconds=60.0, max_tokens=16)
    print(report)
    assert report.ok, report
