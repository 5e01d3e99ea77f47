"""``MetronomeLLM`` through LiveKit's own ``LLMStream`` retry machinery, against ``ChatServer`` on loopback."""

from __future__ import annotations

import asyncio
import itertools
import time

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


# in process: MetronomeLLM(engine=...), the same errors through the same LiveKit machinery ----------


def errors_of(model: MetronomeLLM) -> list[tuple[float, llm.LLMError]]:
    """Every error LiveKit's stream reports for ``model`` (one per failed attempt), with when it came."""
    seen: list[tuple[float, llm.LLMError]] = []
    model.on("error", lambda error: seen.append((time.monotonic(), error)))
    return seen


async def test_in_process_a_reply_streams_and_the_session_holds_the_context(engine: Engine) -> None:
    model = MetronomeLLM(engine=engine, max_tokens=4)
    try:
        ctx = ask("hello")
        first = await collect(model, ctx, APIConnectOptions())
        assert first
        ctx.add_message(role="assistant", content=first)
        ctx.add_message(role="user", content="more")
        assert await collect(model, ctx, APIConnectOptions())
        assert engine.stats().sessions == 1 and engine.stats().admitted == 1  # one session, two turns
    finally:
        await model.aclose()
    assert engine.stats().sessions == 0 and engine.stats().used_blocks == 0  # aclose() closed it
    assert not engine.closed  # the engine is the application's


async def test_in_process_an_admission_refusal_is_retried_after_its_retry_after(engine: Engine) -> None:
    held = [engine.try_session(), engine.try_session()]  # the cap (2) is full
    model = MetronomeLLM(engine=engine, max_tokens=3)
    errors = errors_of(model)
    try:
        # LiveKit alone would wait 5 s before its second retry; the engine advises far less
        stream = model.chat(chat_ctx=ask("hello"), conn_options=APIConnectOptions(max_retry=5, retry_interval=5.0))
        async with stream:
            with anyio.fail_after(10):
                while len(errors) < 2:
                    await asyncio.sleep(0.01)
            for s in held:
                await s.aclose()
            text = "".join([chunk.delta.content or "" async for chunk in stream if chunk.delta])
    finally:
        await model.aclose()
    assert text
    assert stream.attempts == len(errors) + 1 >= 3
    advised = []
    for _, error in errors:
        assert isinstance(error.error, APIStatusError) and error.error.status_code == 429 and error.recoverable
        assert isinstance(error.error.body, dict) and error.error.body["code"] == "AdmissionRejected"
        advised.append(error.error.body["retry_after"])
        assert 0 < advised[-1] < 5.0  # the engine's advice, not LiveKit's retry_interval
    gaps = [b - a for (a, _), (b, _) in itertools.pairwise(errors)]
    assert all(gap >= wait * 0.95 for gap, wait in zip(gaps, advised, strict=False))  # waited what was advised
    assert max(gaps) < 5.0  # and not LiveKit's retry_interval


async def test_in_process_cache_exhausted_is_not_retried() -> None:
    engine = make_engine(KVPolicy.full(), num_blocks=4, block_size=4, limit=2)
    await engine.start()
    try:
        model = MetronomeLLM(engine=engine)
        try:
            stream = model.chat(
                chat_ctx=ask("x" * 40), conn_options=APIConnectOptions(max_retry=3, retry_interval=0.01)
            )
            with pytest.raises(APIStatusError) as caught:
                async with stream:
                    async for _ in stream:
                        pass
        finally:
            await model.aclose()
        assert caught.value.status_code == 400 and not caught.value.retryable
        assert isinstance(caught.value.body, dict) and caught.value.body["code"] == "CacheExhausted"
        assert stream.attempts == 1
        assert engine.stats().used_blocks == 0
    finally:
        await engine.aclose()


async def test_in_process_a_stall_after_output_is_not_retried_and_one_before_it_is() -> None:
    engine = make_engine(KVPolicy.full(), num_blocks=32, block_size=4, limit=2)
    await engine.start()
    try:
        hog = MetronomeLLM(engine=engine, max_tokens=4)
        model = MetronomeLLM(engine=engine, max_tokens=40, stall_retry_after=0.2)
        errors = errors_of(model)
        try:
            await collect(hog, ask("y" * 60), APIConnectOptions())  # its session holds most of the pool
            # the reply begins, then the pool is full: resending would repeat what was said
            options = APIConnectOptions(max_retry=3, retry_interval=0.01)
            stream = model.chat(chat_ctx=ask("hello"), conn_options=options)
            with pytest.raises(APIError) as caught:
                async with stream:
                    async for _ in stream:
                        pass
            assert not caught.value.retryable and stream.attempts == 1
            assert isinstance(caught.value.body, dict) and caught.value.body["code"] == "EngineStalled"
            # the pool is still full: the next turn stalls before any output, a stall that may clear
            errors.clear()
            ctx = ask("hello")
            ctx.add_message(role="assistant", content="...")
            ctx.add_message(role="user", content="again")
            stream = model.chat(chat_ctx=ctx, conn_options=APIConnectOptions(max_retry=5, retry_interval=5.0))
            async with stream:
                with anyio.fail_after(10):
                    while not errors:
                        await asyncio.sleep(0.01)
                await hog.aclose()  # its blocks go back: the retry fits
                text = "".join([chunk.delta.content or "" async for chunk in stream if chunk.delta])
        finally:
            await hog.aclose()
            await model.aclose()
        assert text and stream.attempts >= 2
        first = errors[0][1]
        assert isinstance(first.error, APIStatusError) and first.error.status_code == 503 and first.recoverable
        assert first.error.body["retry_after"] == 0.2  # type: ignore[index]
        assert engine.stats().used_blocks == 0
    finally:
        await engine.aclose()


def test_in_process_arguments_are_checked() -> None:
    with pytest.raises(ValueError, match="engine"):
        MetronomeLLM(engine="not an engine")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not both"):
        MetronomeLLM(engine=make_engine(), api_key="12345678")
    with pytest.raises(ValueError, match="stall_retry_after"):
        MetronomeLLM(engine=make_engine(), stall_retry_after=-1)


async def test_in_process_a_closed_stream_cuts_its_reply_and_a_newer_chat_cuts_the_older() -> None:
    engine = make_engine(KVPolicy.full(), num_blocks=256, limit=2)
    await engine.start()
    try:
        model = MetronomeLLM(engine=engine, max_tokens=300)
        try:
            # LiveKit closes the stream of a reply the user interrupted
            stream = model.chat(chat_ctx=ask("tell me a long story"))
            read = []
            async for chunk in stream:
                read.append(chunk.delta.content if chunk.delta else "")
                if len(read) == 5:
                    break
            await stream.aclose()
            cut = model.last_cut
            assert cut is not None and cut.trimmed
            assert cut.text.startswith("".join(map(str, read))) and len(cut.kept) < 300  # what went out, no more
            # a newer chat while a reply streams: the older ends with an error, never silently
            ctx = ask("tell me a long story")
            ctx.add_message(role="assistant", content=cut.text)
            ctx.add_message(role="user", content="another one")
            older = model.chat(chat_ctx=ctx)
            async with older:
                await older.__anext__()
                ctx.add_message(role="user", content="stop")
                newer = asyncio.ensure_future(collect(model, ctx, APIConnectOptions()))
                with pytest.raises(APIError) as caught:
                    async for _ in older:
                        pass
            assert not caught.value.retryable and "Interrupted" in str(caught.value)
            assert await newer
            assert engine.stats().admitted == 1  # one session throughout
        finally:
            await model.aclose()
        assert engine.stats().used_blocks == 0
    finally:
        await engine.aclose()


async def test_in_process_a_chat_on_another_event_loop_is_refused_with_the_fix(engine: Engine) -> None:
    model = MetronomeLLM(engine=engine, max_tokens=2)
    try:
        assert await collect(model, ask("hello"), APIConnectOptions())

        def elsewhere() -> None:  # as LiveKit's thread executor runs a job: a thread with its own loop
            asyncio.run(collect(model, ask("hello"), APIConnectOptions(max_retry=0)))

        with pytest.raises(RuntimeError, match="metronome serve"):
            await anyio.to_thread.run_sync(elsewhere)
    finally:
        await model.aclose()
    assert engine.stats().used_blocks == 0
