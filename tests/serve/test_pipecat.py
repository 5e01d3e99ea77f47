"""``MetronomeLLMService`` in a real Pipecat pipeline (its own runner and worker), a text source for audio."""

from __future__ import annotations

import asyncio
import warnings
from collections.abc import Callable
from typing import Any

import anyio
import pytest

with warnings.catch_warnings():
    # pipecat's audio helpers import the stdlib's audioop, deprecated in Python 3.11
    warnings.filterwarnings("ignore", "'audioop' is deprecated", DeprecationWarning)
    pytest.importorskip("pipecat", reason="the [pipecat] extra is not installed")
    from pipecat.frames.frames import (
        ErrorFrame,
        Frame,
        InterruptionFrame,
        LLMContextFrame,
        LLMFullResponseEndFrame,
        LLMFullResponseStartFrame,
        LLMTextFrame,
    )
    from pipecat.pipeline.pipeline import Pipeline
    from pipecat.pipeline.worker import PipelineWorker
    from pipecat.processors.aggregators.llm_context import LLMContext
    from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
    from pipecat.utils.errors import ErrorCategory
    from pipecat.workers.runner import WorkerRunner

from metronome_engine import KVPolicy
from metronome_sdk import Engine
from metronome_sdk.integrations import render_turns
from metronome_sdk.integrations.pipecat import MetronomeLLMService, SharedEngine, context_turns
from tests.sdk.conftest import CharTokenizer, make_engine

pytestmark = pytest.mark.timeout(120)


class Recorder(FrameProcessor):  # type: ignore[misc]
    """Passes every frame on and remembers it, with its direction."""

    def __init__(self) -> None:
        super().__init__()
        self.frames: list[tuple[Frame, FrameDirection]] = []

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        self.frames.append((frame, direction))
        await self.push_frame(frame, direction)

    def of(self, kind: type[Frame]) -> list[Frame]:
        return [f for f, _ in self.frames if isinstance(f, kind)]


class Bot:
    """A text-in pipeline: [upstream recorder, Metronome LLM, downstream recorder], run by Pipecat's runner."""

    def __init__(self, llm: MetronomeLLMService) -> None:
        self.llm = llm
        self.up, self.down = Recorder(), Recorder()
        self.context = LLMContext()
        self.worker = PipelineWorker(Pipeline([self.up, llm, self.down]), idle_timeout_secs=None, enable_rtvi=False)
        self.runner = WorkerRunner(handle_sigint=False, check_dangling_tasks=False)
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Bot:
        await self.runner.add_workers(self.worker)
        self._task = asyncio.ensure_future(self.runner.run())
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.worker.cancel()
        assert self._task is not None
        await asyncio.wait_for(self._task, 30)

    async def say(self, text: str) -> None:
        """The user's turn (what a speech-to-text service and the user aggregator would produce)."""
        self.context.add_message({"role": "user", "content": text})
        await self.worker.queue_frame(LLMContextFrame(self.context))

    async def until(self, done: Callable[[], bool], seconds: float = 60) -> None:
        with anyio.fail_after(seconds):
            while not done():
                await asyncio.sleep(0.01)

    def replies(self) -> list[str]:
        """The text of each finished reply, in order."""
        out, current = [], []
        for f, _ in self.down.frames:
            if isinstance(f, LLMFullResponseStartFrame):
                current = []
            elif isinstance(f, LLMTextFrame):
                current.append(f.text)
            elif isinstance(f, LLMFullResponseEndFrame):
                out.append("".join(current))
        return out

    def remember(self, reply: str) -> None:
        """What the assistant aggregator does when a reply ends."""
        self.context.add_message({"role": "assistant", "content": reply})


async def test_two_turns_stream_tokens_between_start_and_end_frames(engine: Engine) -> None:
    llm = MetronomeLLMService(engine=engine, system_prompt="be brief", max_tokens=5)
    async with Bot(llm) as bot:
        await bot.say("hello")
        await bot.until(lambda: len(bot.replies()) == 1)
        bot.remember(bot.replies()[0])
        await bot.say("again")
        await bot.until(lambda: len(bot.replies()) == 2)
        assert llm.conversation is not None and llm.conversation.turns == 2
        assert engine.stats().admitted == 1  # one session for the pipeline
    assert all(bot.replies())
    assert not bot.up.of(ErrorFrame)
    assert engine.stats().sessions == 0  # closed with the pipeline
    assert engine.stats().used_blocks == 0


class PushingService(MetronomeLLMService):
    """The service under test, remembering the text it pushed, reply by reply."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.pushed: list[list[str]] = []

    async def _respond(self, context: LLMContext) -> None:
        self.pushed.append([])
        await super()._respond(context)

    async def _push_llm_text(self, text: str) -> None:
        self.pushed[-1].append(text)  # before pushing: a cancel may land while it goes out
        await super()._push_llm_text(text)


async def test_an_interruption_stops_the_tokens_at_once_and_the_context_keeps_what_was_pushed() -> None:
    # the full policy and one token a character: the session's context length says what it holds
    engine = make_engine(KVPolicy.full(), num_blocks=256, limit=2)
    await engine.start()
    try:
        llm = PushingService(engine=engine, max_tokens=300)
        async with Bot(llm) as bot:
            await bot.say("tell me a long story")
            await bot.until(lambda: len(bot.down.of(LLMTextFrame)) >= 5)
            await bot.worker.queue_frame(InterruptionFrame())
            await bot.until(lambda: bool(bot.down.of(InterruptionFrame)))
            at = len(bot.down.frames)
            await asyncio.sleep(0.3)  # many ticks of the 1 ms metronome: a reply still running would push tokens
            after = [f for f, _ in bot.down.frames[at:] if isinstance(f, LLMTextFrame)]
            assert after == []
            conversation = llm.conversation
            assert conversation is not None
            cut = conversation.last_cut
            assert cut is not None and cut.trimmed and cut.withdrawn <= 1  # the frame in flight, if any
            first = "".join(llm.pushed[0])
            assert 5 <= len(first) < 300 and cut.text == first  # kept: exactly the tokens pushed
            await bot.say("a short question")
            await bot.until(lambda: len(llm.pushed) == 2 and len(bot.replies()) >= 2)
            second = "".join(llm.pushed[1])
            assert second and bot.replies()[-1] == second  # the next turn answered in step
            # the context: turn 1, the cut reply's pushed tokens, turn 2, the reply but its last token
            # (it goes in with the next input); a token decoded and not pushed would add one
            tok = CharTokenizer()
            asked = render_turns(tok, [{"role": "user", "content": "tell me a long story"}], first=True)
            again = render_turns(tok, [{"role": "user", "content": "a short question"}], first=False)
            stopped = len(second) < 300  # the tiny model ended its turn: its stop token decodes to nothing
            expected = len(asked) + len(cut.kept) + len(again) + len(second) + stopped - 1
            assert conversation.session.stats().num_tokens == expected
        assert not bot.up.of(ErrorFrame)
        assert engine.stats().used_blocks == 0
    finally:
        await engine.aclose()


async def test_an_admission_rejection_is_a_rate_limit_error_frame(engine: Engine) -> None:
    held = [engine.try_session(), engine.try_session()]  # the cap (2) is full
    llm = MetronomeLLMService(engine=engine, max_tokens=3)
    async with Bot(llm) as bot:
        await bot.say("hello")
        await bot.until(lambda: bool(bot.up.of(ErrorFrame)))
        error = bot.up.of(ErrorFrame)[0]
        assert isinstance(error, ErrorFrame)
        assert error.category is ErrorCategory.RATE_LIMIT
        assert "AdmissionRejected" in error.error
        assert llm.is_usable  # a rate limit is not permanent: the next turn may be served
        await held[0].aclose()
        await bot.say("hello again")
        await bot.until(lambda: len(bot.replies()) == 2 and bot.replies()[-1] != "")
    await held[1].aclose()


def test_context_turns_keeps_text_turns_only() -> None:
    messages = [
        {"role": "developer", "content": "sys"},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "image_url", "image_url": {}}]},
        {"role": "tool", "content": "42"},
        {"role": "assistant", "content": None, "tool_calls": []},
        object(),
    ]
    assert context_turns(messages) == [{"role": "system", "content": "sys"}, {"role": "user", "content": "a"}]


async def test_services_given_no_engine_share_the_loops_engine_until_the_last_one_stops() -> None:
    first, second = SharedEngine.acquire(), SharedEngine.acquire()
    assert first is second and SharedEngine.current() is first
    await SharedEngine.release(first)
    assert not first.closed  # the other service still uses it
    await SharedEngine.release(second)
    assert first.closed and SharedEngine.current() is None
    third = SharedEngine.acquire()  # a later call gets a fresh one
    assert third is not first and not third.closed
    await SharedEngine.release(third)
