"""A Pipecat bot whose LLM is a Metronome session, with typed text in place of speech.

The pipeline is a voice bot's middle: context aggregators around ``MetronomeLLMService``.
In a real bot, a transport's input, speech-to-text and turn detection come before the
user aggregator, and text-to-speech and the transport's output after the printer.

    pip install "metronome-sdk[pipecat]"
    python examples/pipecat_bot.py ["first question" "second question" ...]
"""

from __future__ import annotations

import argparse
import asyncio
import warnings

with warnings.catch_warnings():  # pipecat's audio helpers import the deprecated stdlib audioop
    warnings.simplefilter("ignore", DeprecationWarning)
    from pipecat.frames.frames import EndFrame, Frame, LLMFullResponseEndFrame, LLMMessagesAppendFrame, TextFrame
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.pipeline.worker import PipelineWorker
    from pipecat.processors.aggregators.llm_context import LLMContext
    from pipecat.processors.aggregators.llm_response_universal import LLMContextAggregatorPair
    from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
    from pipecat.workers.runner import WorkerRunner

import metronome_sdk as metronome
from metronome_sdk.integrations.pipecat import MetronomeLLMService


class Printer(FrameProcessor):
    """Prints the reply as it streams (where text-to-speech would go) and says when it ends."""

    def __init__(self) -> None:
        super().__init__()
        self.replied = asyncio.Event()

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, TextFrame):
            print(frame.text, end="", flush=True)
        elif isinstance(frame, LLMFullResponseEndFrame):
            print()
            self.replied.set()
        await self.push_frame(frame, direction)


async def main(questions: list[str]) -> None:
    timing = metronome.TimingConfig(max_chunk_tokens=16)  # short prefill steps on a CPU
    async with metronome.Engine(timing=timing) as engine:
        llm = MetronomeLLMService(engine=engine, system_prompt="Answer in one short sentence.", max_tokens=32)
        context = LLMContext()
        aggregators = LLMContextAggregatorPair(context)
        printer = Printer()
        pipeline = Pipeline([aggregators.user(), llm, printer, aggregators.assistant()])
        worker = PipelineWorker(pipeline, idle_timeout_secs=None, enable_rtvi=False)
        runner = WorkerRunner(handle_sigint=False)
        await runner.add_workers(worker)
        running = asyncio.ensure_future(runner.run())
        for question in questions:  # what the user "said", one turn each
            print(f"user: {question}\nbot:  ", end="", flush=True)
            printer.replied.clear()
            await worker.queue_frame(LLMMessagesAppendFrame([{"role": "user", "content": question}], run_llm=True))
            await printer.replied.wait()
        await worker.queue_frame(EndFrame())  # the call ends: stop() closes the session
        await running
        s = engine.stats()
        print(f"engine: {s.admitted} session, {s.frames} frames, {s.used_blocks} blocks in use after the call")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("questions", nargs="*", default=["What is the capital of France?", "And of Italy?"])
    asyncio.run(main(parser.parse_args().questions))
