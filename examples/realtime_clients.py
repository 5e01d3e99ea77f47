"""Three Realtime API clients, unchanged but for their base URL, against ``metronome serve``'s ``/v1/realtime``.

The official ``openai`` client, Pipecat's ``OpenAIRealtimeLLMService`` and LiveKit's
``openai.realtime.RealtimeModel`` each ask one typed question and hear a spoken answer
(pcm16, 24 kHz) with its transcript. Start the server first (it loads the voice too):

    pip install "metronome-sdk[voice,pipecat,livekit]"
    metronome serve &
    python examples/realtime_clients.py [--base-url http://127.0.0.1:8000/v1]

For speech in, append microphone audio (pcm16, 24 kHz, base64) with
``input_audio_buffer.append``: the server's turn detector ends each turn and answers it.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import os
import warnings

QUESTION = "What is the capital of France?"
INSTRUCTIONS = "Answer the question in one short English sentence. Be factual and direct."
API_KEY = os.environ.get("METRONOME_TOKEN", "unused")  # the server's token, if it was started with one


async def ask_openai(base_url: str, question: str = QUESTION) -> tuple[str, float]:
    """The official client: the answer's transcript and the seconds of its audio."""
    import openai

    async with (
        openai.AsyncOpenAI(base_url=base_url, api_key=API_KEY) as client,
        client.realtime.connect(model="metronome") as conn,
    ):
        await conn.session.update(session={"type": "realtime", "instructions": INSTRUCTIONS})
        await conn.conversation.item.create(
            item={"type": "message", "role": "user", "content": [{"type": "input_text", "text": question}]}
        )
        await conn.response.create()
        transcript, audio = [], 0
        async for event in conn:
            if event.type == "response.output_audio_transcript.delta":
                transcript.append(event.delta)
            elif event.type == "response.output_audio.delta":
                audio += len(base64.b64decode(event.delta))
            elif event.type == "error":
                raise RuntimeError(f"{event.error.code}: {event.error.message}")
            elif event.type == "response.done":
                return "".join(transcript), audio / 2 / 24000
    raise RuntimeError("the connection closed before the answer was done")


async def ask_pipecat(base_url: str, question: str = QUESTION) -> tuple[str, float]:
    """Pipecat's realtime service in a pipeline: the text and audio frames it pushes downstream."""
    with warnings.catch_warnings():  # pipecat imports the stdlib's deprecated audioop
        warnings.filterwarnings("ignore", "'audioop' is deprecated", DeprecationWarning)
        from pipecat.frames.frames import (
            Frame,
            LLMContextFrame,
            LLMFullResponseEndFrame,
            TTSAudioRawFrame,
            TTSTextFrame,
        )
        from pipecat.pipeline.pipeline import Pipeline
        from pipecat.pipeline.worker import PipelineWorker
        from pipecat.processors.aggregators.llm_context import LLMContext
        from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
        from pipecat.services.openai.realtime.llm import OpenAIRealtimeLLMService
        from pipecat.workers.runner import WorkerRunner

    done = asyncio.Event()
    text, audio = [], 0

    class Listener(FrameProcessor):  # type: ignore[misc]  # where the bot's output transport would be
        async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
            nonlocal audio
            await super().process_frame(frame, direction)
            if isinstance(frame, TTSTextFrame):
                text.append(frame.text)
            elif isinstance(frame, TTSAudioRawFrame):
                audio += len(frame.audio)
            elif isinstance(frame, LLMFullResponseEndFrame):
                done.set()
            await self.push_frame(frame, direction)

    llm = OpenAIRealtimeLLMService(
        api_key=API_KEY,
        base_url=base_url.replace("http", "ws", 1) + "/realtime",  # ws://127.0.0.1:8000/v1/realtime
        settings=OpenAIRealtimeLLMService.Settings(model="metronome", system_instruction=INSTRUCTIONS),
    )
    worker = PipelineWorker(Pipeline([llm, Listener()]), idle_timeout_secs=None, enable_rtvi=False)
    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    running = asyncio.ensure_future(runner.run())
    try:
        context = LLMContext()
        context.add_message({"role": "user", "content": question})
        await worker.queue_frame(LLMContextFrame(context))
        await asyncio.wait_for(done.wait(), 60)
    finally:
        await worker.cancel()
        await running
    return "".join(text), audio / 2 / 24000


async def ask_livekit(base_url: str, question: str = QUESTION) -> tuple[str, float]:
    """LiveKit's realtime model, as an ``AgentSession`` drives it: the generation's text and audio streams."""
    from livekit.agents import llm
    from livekit.plugins.openai.realtime import RealtimeModel

    model = RealtimeModel(model="metronome", api_key=API_KEY, base_url=base_url)
    session = model.session()
    try:
        await session.update_instructions(INSTRUCTIONS)
        chat = llm.ChatContext.empty()
        chat.add_message(role="user", content=question)
        await session.update_chat_ctx(chat)
        generation = await session.generate_reply()
        text, audio = [], 0
        async for message in generation.message_stream:
            async for delta in message.text_stream:
                text.append(delta)
            async for frame in message.audio_stream:
                audio += frame.samples_per_channel
        return "".join(text), audio / 24000
    finally:
        await session.aclose()
        await model.aclose()


async def main(base_url: str) -> None:
    for name, ask in (("openai", ask_openai), ("pipecat", ask_pipecat), ("livekit", ask_livekit)):
        answer, seconds = await ask(base_url)
        print(f"{name}: {' '.join(answer.split())}  ({seconds:.1f} s of speech)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    asyncio.run(main(parser.parse_args().base_url))
