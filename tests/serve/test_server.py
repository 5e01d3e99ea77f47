"""``ChatServer`` through the official OpenAI client, on the tiny random Llama (fast)."""

from __future__ import annotations

import asyncio

import anyio
import httpx2
import openai
import pytest

from metronome_engine import KVPolicy
from metronome_sdk import Engine
from metronome_sdk.serve import ChatServer, ServeConfig
from tests.sdk.conftest import make_engine
from tests.serve.conftest import TOKEN, recording, serving

pytestmark = pytest.mark.timeout(60)

USER = [{"role": "user", "content": "hello there"}]


def client(server: ChatServer, **kwargs: object) -> openai.AsyncOpenAI:
    return openai.AsyncOpenAI(base_url=server.url, api_key=TOKEN, **kwargs)  # type: ignore[arg-type]


async def test_the_openai_client_gets_a_completion_and_a_stream(engine: Engine) -> None:
    async with await serving(engine) as server, client(server) as c:
        whole = await c.chat.completions.create(model="any", messages=USER, max_tokens=5)
        assert whole.choices[0].finish_reason == "length"
        assert whole.usage is not None and whole.usage.completion_tokens == 5
        stream = await c.chat.completions.create(model="any", messages=USER, max_tokens=5, stream=True)
        chunks = [chunk async for chunk in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert chunks[-1].choices[0].finish_reason == "length"
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks)
    assert text == whole.choices[0].message.content  # greedy: the same reply both ways
    assert engine.stats().sessions == 0 and engine.stats().used_blocks == 0  # a session per request, closed


async def test_a_full_admission_cap_is_429_and_the_client_retries_after_the_advertised_delay(engine: Engine) -> None:
    server = await serving(engine)
    seen = recording(server)
    held = [engine.try_session(), engine.try_session()]  # the cap (2) is full
    async with server, client(server, max_retries=3) as c:
        request = asyncio.ensure_future(c.chat.completions.create(model="any", messages=USER, max_tokens=3))
        with anyio.fail_after(10):
            while not seen.requests:
                await asyncio.sleep(0.01)
        for s in held:
            await s.aclose()  # room, while the client waits out retry-after-ms
        reply = await request
    assert reply.choices[0].message.content
    assert seen.statuses() == [429, 200]  # the client's own retry, once
    (refused_at, _, headers), (retried_at, _, _) = seen.requests
    assert headers["x-should-retry"] == "true"
    waited_ms = (retried_at - refused_at) * 1000
    assert waited_ms >= int(headers["retry-after-ms"]) * 0.95  # it waited what it was told (timer slack)


async def test_a_429_body_is_openai_shaped_and_names_the_exception(engine: Engine) -> None:
    held = [engine.try_session(), engine.try_session()]
    async with await serving(engine) as server, client(server, max_retries=0) as c:
        with pytest.raises(openai.RateLimitError) as caught:
            await c.chat.completions.create(model="any", messages=USER)
    for s in held:
        await s.aclose()
    err = caught.value
    assert err.status_code == 429
    assert isinstance(err.body, dict) and err.body["code"] == "AdmissionRejected"
    assert err.body["type"] == "rate_limit_error" and err.body["retry_after"] > 0
    assert int(err.response.headers["retry-after-ms"]) >= 1


async def test_cache_exhausted_is_400_and_not_retried() -> None:
    # a full-KV engine whose pool holds 16 tokens: this session can never fit
    engine = make_engine(KVPolicy.full(), num_blocks=4, block_size=4, limit=2)
    await engine.start()
    try:
        server = await serving(engine)
        seen = recording(server)
        async with server, client(server, max_retries=3) as c:
            with pytest.raises(openai.BadRequestError) as caught:
                await c.chat.completions.create(model="any", messages=[{"role": "user", "content": "x" * 40}])
        assert caught.value.response.headers["x-should-retry"] == "false"
        assert isinstance(caught.value.body, dict) and caught.value.body["code"] == "CacheExhausted"
        assert seen.statuses() == [400]  # one attempt: the client obeyed x-should-retry
        assert engine.stats().used_blocks == 0
    finally:
        await engine.aclose()


async def test_a_stall_after_the_first_token_is_an_error_event_not_a_silent_end() -> None:
    # full KV, 20 blocks of 4 tokens: two sessions fit alone, not together
    engine = make_engine(KVPolicy.full(), num_blocks=20, block_size=4, limit=2)
    await engine.start()
    try:
        async with await serving(engine, max_tokens=200, max_tokens_limit=200) as server, client(server) as c:
            hog = [{"role": "user", "content": "y" * 40}]
            await c.chat.completions.create(
                model="any", messages=hog, max_tokens=10, extra_headers={"X-Metronome-Session": "hog"}
            )
            stream = await c.chat.completions.create(model="any", messages=USER, max_tokens=200, stream=True)
            got: list[str] = []
            with pytest.raises(openai.APIError) as caught:
                async for chunk in stream:
                    got.append(chunk.choices[0].delta.content or "" if chunk.choices else "")
        assert "".join(got)  # tokens came first
        assert isinstance(caught.value.body, dict) and caught.value.body["code"] == "EngineStalled"
        assert "pool is full" in caught.value.message
    finally:
        await engine.aclose()
    assert engine.stats().used_blocks == 0


async def test_a_named_session_lives_between_requests_and_closes_when_idle(engine: Engine) -> None:
    key = {"metronome_session": "call-1"}
    async with await serving(engine, idle_timeout=0.3) as server, client(server) as c:
        for i in range(3):
            await c.chat.completions.create(
                model="any",
                messages=[{"role": "user", "content": f"turn {i}"}],
                max_tokens=3,
                extra_body=key,
            )
            assert server.named_sessions == 1 and engine.stats().sessions == 1
        assert engine.stats().admitted == 1  # one session served all three turns
        with pytest.raises(openai.BadRequestError, match="no new message"):  # it has seen all of these
            await c.chat.completions.create(
                model="any", messages=[*USER, {"role": "assistant", "content": "hi"}], extra_body=key
            )
        assert engine.stats().used_blocks > 0
        with anyio.fail_after(10):
            while server.named_sessions:
                await asyncio.sleep(0.05)
        assert engine.stats().sessions == 0 and engine.stats().used_blocks == 0


async def test_deleting_a_named_session_closes_it_at_once(engine: Engine) -> None:
    async with await serving(engine) as server, client(server) as c:
        await c.chat.completions.create(model="any", messages=USER, max_tokens=2, extra_body={"metronome_session": "k"})
        assert engine.stats().sessions == 1
        async with httpx2.AsyncClient() as http:
            assert (await http.delete(f"{server.url}/sessions/k")).status_code == 200
            assert (await http.delete(f"{server.url}/sessions/k")).status_code == 404
    assert server.named_sessions == 0 and engine.stats().used_blocks == 0


async def test_a_newer_request_on_a_session_interrupts_its_reply_with_an_error_event(engine: Engine) -> None:
    key = {"X-Metronome-Session": "barge"}
    async with await serving(engine, max_tokens_limit=500) as server, client(server) as c:
        stream = await c.chat.completions.create(
            model="any", messages=USER, max_tokens=500, stream=True, extra_headers=key
        )
        first = await stream.__anext__()
        assert first.choices[0].delta.role == "assistant"
        second = asyncio.ensure_future(
            c.chat.completions.create(
                model="any", messages=[{"role": "user", "content": "stop"}], max_tokens=3, extra_headers=key
            )
        )
        with pytest.raises(openai.APIError) as caught:
            async for _ in stream:
                pass
        assert isinstance(caught.value.body, dict) and caught.value.body["code"] == "Interrupted"
        assert (await second).choices[0].message.content
    assert engine.stats().admitted == 1


async def test_a_client_that_hangs_up_mid_stream_frees_its_session(engine: Engine) -> None:
    async with await serving(engine, max_tokens_limit=1000) as server, client(server) as c:
        stream = await c.chat.completions.create(model="any", messages=USER, max_tokens=1000, stream=True)
        await stream.__anext__()
        await stream.close()
        with anyio.fail_after(10):  # the session closes, then its blocks come back once its last tick ends
            while engine.stats().sessions or engine.stats().used_blocks:
                await asyncio.sleep(0.02)
    assert engine.stats().sessions == 0 and engine.stats().used_blocks == 0


async def test_bad_requests_get_clear_openai_shaped_errors(engine: Engine) -> None:
    async with await serving(engine, token=TOKEN, max_body=2048) as server:
        url = f"{server.url}/chat/completions"
        auth = {"Authorization": f"Bearer {TOKEN}"}
        async with httpx2.AsyncClient() as http:
            r = await http.post(url, json={"messages": USER})
            assert r.status_code == 401 and r.json()["error"]["code"] == "Unauthorized"
            r = await http.post(url, json={"messages": USER}, headers={"Authorization": "Bearer wrong-token"})
            assert r.status_code == 401
            r = await http.post(url, json={"messages": [{"role": "user", "content": "x" * 4096}]}, headers=auth)
            assert r.status_code == 413
            r = await http.post(url, content=b"{}", headers={**auth, "Content-Type": "text/plain"})
            assert r.status_code == 415
            for body, field in [
                ({}, "messages"),
                ({"messages": [{"role": "robot", "content": "x"}]}, "role"),
                ({"messages": USER, "max_tokens": 0}, "max_tokens"),
                ({"messages": USER, "n": 2}, "n must be 1"),
                ({"messages": USER, "tools": [{"type": "function"}]}, "tools"),
                ({"messages": USER, "bogus": 1}, "bogus"),
                ({"messages": USER, "metronome_session": "bad key!"}, "session key"),
            ]:
                r = await http.post(url, json=body, headers=auth)
                assert r.status_code == 400, body
                assert r.json()["error"]["type"] == "invalid_request_error"
                assert field in r.json()["error"]["message"], (body, r.json())
                assert r.headers["x-should-retry"] == "false"
            r = await http.post(url, content=b"not json", headers={**auth, "Content-Type": "application/json"})
            assert r.status_code == 400
    assert engine.stats().sessions == 0 and engine.stats().used_blocks == 0


async def test_metrics_and_healthz(engine: Engine) -> None:
    async with await serving(engine) as server, client(server) as c:
        await c.chat.completions.create(model="any", messages=USER, max_tokens=2)
        async with httpx2.AsyncClient() as http:
            base = server.url.removesuffix("/v1")
            metrics = (await http.get(f"{base}/metrics")).text
            health = await http.get(f"{base}/healthz")
    assert 'metronome_serve_requests_total{status="200"} 1.0' in metrics
    assert "metronome_frames_total" in metrics  # the engine's own, beside the server's
    assert health.status_code == 200 and health.json()["status"] == "ok"


def test_config_is_checked_when_made() -> None:
    assert ServeConfig().host == "127.0.0.1"
    for bad in (
        {"port": -1},
        {"token": "short"},
        {"max_body": 10},
        {"max_tokens": 0},
        {"max_tokens": 10, "max_tokens_limit": 5},
        {"admission_wait": -1},
        {"idle_timeout": 0},
    ):
        with pytest.raises(ValueError):
            ServeConfig(**bad)  # type: ignore[arg-type]
    assert "token=set" in repr(ServeConfig(token="12345678")) and "12345678" not in repr(ServeConfig(token="12345678"))


async def test_a_reply_says_what_the_window_has_dropped() -> None:
    engine = make_engine(KVPolicy.windowed(8, sinks=4), num_blocks=64, limit=2)
    await engine.start()
    system = {"role": "system", "content": "be brief"}
    try:
        async with await serving(engine) as server, client(server) as c:
            headers, streamed = [], []
            for key in ("whole", "streamed"):
                for i in range(3):
                    messages = [system, {"role": "user", "content": f"turn {i}"}]
                    if key == "whole":
                        raw = await c.chat.completions.with_raw_response.create(
                            model="any", messages=messages, max_tokens=4, extra_body={"metronome_session": key}
                        )
                        headers.append(raw.headers)
                        continue
                    stream = await c.chat.completions.create(
                        model="any", messages=messages, max_tokens=4, stream=True, extra_body={"metronome_session": key}
                    )
                    chunks = [chunk async for chunk in stream]
                    # only the last chunk carries it: after the reply, what the model still sees
                    assert all("metronome" not in (ch.model_extra or {}) for ch in chunks[:-1])
                    assert chunks[-1].choices[0].finish_reason is not None
                    streamed.append((chunks[-1].model_extra or {})["metronome"])
    finally:
        await engine.aclose()
    evicted = [int(h["x-metronome-evicted-tokens"]) for h in headers]
    assert evicted == sorted(evicted) and evicted[-1] > 0  # a window of 8 tokens: the turns slide out
    assert all(h["x-metronome-system-prompt-resident"] == "true" for h in headers)  # the prompt is pinned
    # the same facts at the end of a stream, the same turn for turn (greedy: the same replies)
    assert [s["evicted_tokens"] for s in streamed] == evicted
    assert all(s["system_prompt_resident"] is True for s in streamed)
    oldest = [h.get("x-metronome-oldest-resident-turn") for h in headers]
    oldest = [int(o) if o is not None else None for o in oldest]
    assert [s["oldest_resident_turn"] for s in streamed] == oldest


def test_the_docs_table_is_the_error_mapping() -> None:
    from pathlib import Path

    from metronome_sdk.integrations._errors import rows

    page = (Path(__file__).resolve().parents[2] / "docs" / "integrations.md").read_text(encoding="utf-8")
    documented = [line for line in page.splitlines() if line.startswith("| `")]
    expected = [
        f"| `{r.exception}` | {r.status} | `{r.openai_type}` | {str(r.retryable).lower()} | `{r.pipecat}` |"
        for _, r in rows()
    ]
    assert [line[: len(e)] for line, e in zip(documented, expected, strict=True)] == expected


async def test_several_tokens_a_tick_never_run_past_max_tokens(engine: Engine) -> None:
    async with await serving(engine, decode_tokens=4) as server, client(server) as c:
        whole = await c.chat.completions.create(model="any", messages=USER, max_tokens=7)
        stream = await c.chat.completions.create(model="any", messages=USER, max_tokens=7, stream=True)
        text = "".join([ch.choices[0].delta.content or "" async for ch in stream if ch.choices])
    assert whole.usage is not None
    if whole.choices[0].finish_reason == "length":
        assert whole.usage.completion_tokens == 7  # 4 + 3, not 4 + 4
    else:
        assert whole.usage.completion_tokens <= 7
    assert text == whole.choices[0].message.content
