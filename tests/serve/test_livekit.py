"""``MetronomeLLM`` through LiveKit's own ``LLMStream`` retry machinery, against ``ChatServer`` on loopback."""

from __future__ import annotations

import asyncio

import anyio
import pytest

pytest.importorskip("livekit.agents", reason="the [livekit] extra is not installed")

from livekit.agents import APIConnectOptions, APIError, APIStatusError, llm

from metronome_engine import KVPolicy
from metronome_sdk import Engine
from metronome_sdk.integrations.livekit import MetronomeLLM, chat_turns
from tests.sdk.conftest import make_engine
from tests.serve.conftest import TOKEN, recording, serving

pytestmark = pytest.mark.timeout(60)


def ask(text: str) -> llm.ChatContext:
    ctx = llm.ChatContext.empty()
    ctx.add_message(role="system", content="be brief")
    ctx.add_message(role="user", content=text)
    return ctx


async def collect(model: MetronomeLLM, ctx: llm.ChatContext, options: APIConnectOptions) -> str:
    async with model.chat(chat_ctx=ctx, conn_options=options) as stream:
        return "".join([chunk.delta.content or "" async for chunk in stream if chunk.delta])


async def test_a_reply_streams_and_the_session_holds_the_context(engine: Engine) -> None:
    async with await serving(engine, token=TOKEN) as server:
        model = MetronomeLLM(base_url=server.url, api_key=TOKEN, max_tokens=4)
        try:
            ctx = ask("hello")
            first = await collect(model, ctx, APIConnectOptions())
            assert first
            ctx.add_message(role="assistant", content=first)
            ctx.add_message(role="user", content="more")
            assert await collect(model, ctx, APIConnectOptions())
            assert server.named_sessions == 1 and engine.stats().admitted == 1  # one session, two turns
        finally:
            await model.aclose()
        assert server.named_sessions == 0  # aclose() ended the session on the server
        assert engine.stats().sessions == 0 and engine.stats().used_blocks == 0


async def test_a_429_is_retried_after_the_advertised_delay_not_livekits_interval(engine: Engine) -> None:
    server = await serving(engine)
    seen = recording(server)
    held = [engine.try_session(), engine.try_session()]  # the cap (2) is full
    async with server:
        model = MetronomeLLM(base_url=server.url, max_tokens=3)
        try:
            # LiveKit alone would wait 5 s before its second retry; the server advises far less
            options = APIConnectOptions(max_retry=5, retry_interval=5.0)
            reply = asyncio.ensure_future(collect(model, ask("hello"), options))
            with anyio.fail_after(10):
                while len(seen.requests) < 2:
                    await asyncio.sleep(0.01)
            for s in held:
                await s.aclose()
            text = await reply
        finally:
            await model.aclose()
    assert text
    statuses = seen.statuses()
    assert statuses[-1] == 200 and set(statuses[:-1]) == {429} and len(statuses) >= 3
    gaps = []
    for (refused_at, _, headers), (next_at, _, _) in zip(seen.requests, seen.requests[1:], strict=False):
        advised = int(headers["retry-after-ms"]) / 1000
        gaps.append(next_at - refused_at)
        assert next_at - refused_at >= advised * 0.95  # waited what the server advised
    assert max(gaps) < 5.0  # and not LiveKit's retry_interval


async def test_cache_exhausted_is_not_retried() -> None:
    engine = make_engine(KVPolicy.full(), num_blocks=4, block_size=4, limit=2)
    await engine.start()
    try:
        server = await serving(engine)
        seen = recording(server)
        async with server:
            model = MetronomeLLM(base_url=server.url)
            try:
                with pytest.raises(APIStatusError) as caught:
                    await collect(model, ask("x" * 40), APIConnectOptions(max_retry=3, retry_interval=0.01))
            finally:
                await model.aclose()
        assert caught.value.status_code == 400 and not caught.value.retryable
        assert isinstance(caught.value.body, dict) and caught.value.body["code"] == "CacheExhausted"
        assert seen.statuses() == [400]
    finally:
        await engine.aclose()


async def test_a_stall_after_output_is_an_error_and_not_retried() -> None:
    engine = make_engine(KVPolicy.full(), num_blocks=20, block_size=4, limit=2)
    await engine.start()
    try:
        server = await serving(engine, max_tokens_limit=200)
        seen = recording(server)
        async with server:
            hog = MetronomeLLM(base_url=server.url, max_tokens=10)
            model = MetronomeLLM(base_url=server.url, max_tokens=200)
            try:
                await collect(hog, ask("y" * 40), APIConnectOptions())
                with pytest.raises(APIError) as caught:
                    await collect(model, ask("hello"), APIConnectOptions(max_retry=3, retry_interval=0.01))
            finally:
                await hog.aclose()
                await model.aclose()
        assert not caught.value.retryable
        assert isinstance(caught.value.body, dict) and caught.value.body["code"] == "EngineStalled"
        assert seen.statuses() == [200, 200]  # the second stream began, then failed: one attempt
    finally:
        await engine.aclose()


def test_chat_turns_and_bad_arguments() -> None:
    ctx = llm.ChatContext.empty()
    ctx.add_message(role="developer", content="sys")
    ctx.add_message(role="user", content="hi")
    assert chat_turns(ctx) == [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi"}]
    with pytest.raises(ValueError, match="base_url"):
        MetronomeLLM(base_url="127.0.0.1:8000")
    with pytest.raises(ValueError, match="max_tokens"):
        MetronomeLLM(max_tokens=0)
