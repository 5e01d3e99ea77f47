"""Pipecat's ``OpenAIRealtimeLLMService`` and LiveKit's ``RealtimeModel`` each hold a turn against ``/v1/realtime``.

The real classes, unpatched, pointed at a local server by ``base_url``; the engine is the tiny
model and the voice a fake (a tone per clause), so what is checked is the wire: the events each
framework waits for come, in the order it needs, and its turn ends with audio and a transcript.
"""

from __future__ import annotations

import asyncio
import warnings

import anyio
import numpy as np
import pytest

from metronome_sdk import Engine
from tests.serve.test_realtime import realtime_server

pytestmark = pytest.mark.timeout(120)


async def test_pipecats_realtime_service_holds_a_turn(engine: Engine) -> None:
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "'audioop' is deprecated", DeprecationWarning)
        pytest.importorskip("pipecat", reason="the [pipecat] extra is not installed")
        from pipecat.frames.frames import (
            ErrorFrame,
            LLMContextFrame,
            LLMFullResponseEndFrame,
            TTSAudioRawFrame,
            TTSTextFrame,
        )
        from pipecat.pipeline.pipeline import Pipeline
        from pipecat.pipeline.worker import PipelineWorker
        from pipecat.processors.aggregators.llm_context import LLMContext
        from pipecat.services.openai.realtime.llm import OpenAIRealtimeLLMService
        from pipecat.workers.runner import WorkerRunner

        from tests.serve.test_pipecat import Recorder

    async with realtime_server(engine) as server:
        llm = OpenAIRealtimeLLMService(
            api_key="unused",
            base_url=server.url.replace("http", "ws", 1) + "/realtime",
            settings=OpenAIRealtimeLLMService.Settings(model="metronome", system_instruction="Be brief."),
        )
        up, down = Recorder(), Recorder()
        worker = PipelineWorker(Pipeline([up, llm, down]), idle_timeout_secs=None, enable_rtvi=False)
        runner = WorkerRunner(handle_sigint=False, check_dangling_tasks=False)
        await runner.add_workers(worker)
        task = asyncio.ensure_future(runner.run())
        try:
            context = LLMContext()
            context.add_message({"role": "user", "content": "hello"})
            await worker.queue_frame(LLMContextFrame(context))
            with anyio.fail_after(60):
                while not down.of(LLMFullResponseEndFrame) and not up.of(ErrorFrame):
                    await asyncio.sleep(0.02)
        finally:
            await worker.cancel()
            await asyncio.wait_for(task, 30)
    assert not up.of(ErrorFrame) and not down.of(ErrorFrame), [f.error for f in up.of(ErrorFrame)]
    audio = [f for f in down.of(TTSAudioRawFrame) if isinstance(f, TTSAudioRawFrame)]
    assert audio and all(f.sample_rate == 24000 for f in audio)
    assert sum(len(f.audio) for f in audio) / 2 / 24000 >= 0.5  # the tone, at least one clause of it
    assert "".join(f.text for f in down.of(TTSTextFrame) if isinstance(f, TTSTextFrame)).strip()
    with anyio.fail_after(10):
        while engine.stats().sessions:
            await anyio.sleep(0.02)
    assert engine.stats().used_blocks == 0


async def test_livekits_realtime_model_holds_a_turn(engine: Engine) -> None:
    pytest.importorskip("livekit.agents", reason="the [livekit] extra is not installed")
    from livekit.agents import llm
    from livekit.plugins.openai.realtime import RealtimeModel

    async with realtime_server(engine) as server:
        model = RealtimeModel(model="metronome", api_key="unused", base_url=server.url)
        session = model.session()
        try:
            await session.update_instructions("Be brief.")
            ctx = llm.ChatContext.empty()
            ctx.add_message(role="user", content="hello")
            await session.update_chat_ctx(ctx)
            generation = await asyncio.wait_for(session.generate_reply(), 20)
            text: list[str] = []
            samples = 0
            with anyio.fail_after(60):
                async for message in generation.message_stream:
                    async for delta in message.text_stream:
                        text.append(delta)
                    async for frame in message.audio_stream:
                        assert frame.sample_rate == 24000
                        samples += frame.samples_per_channel
                        assert np.frombuffer(frame.data, dtype=np.int16).size == frame.samples_per_channel
        finally:
            await session.aclose()
            await model.aclose()
    assert "".join(text).strip()
    assert samples / 24000 >= 0.5
    with anyio.fail_after(10):
        while engine.stats().sessions:
            await anyio.sleep(0.02)
    assert engine.stats().used_blocks == 0
