"""The signaling server refuses bad input with a status and a reason, never a 500 or a traceback."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import aiohttp
import pytest

from metronome_sdk import AdmissionConfig, Engine
from metronome_sdk.webrtc import ServerConfig
from tests.sdk.conftest import make_engine
from tests.webrtc.client import Call, answered, offer_sdp, tone
from tests.webrtc.conftest import tiny_server

pytestmark = pytest.mark.timeout(60)


async def _post(
    url: str, body: object = None, *, data: bytes | None = None, token: str | None = None
) -> tuple[int, dict[str, object], dict[str, str]]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    if data is not None:
        headers["Content-Type"] = "application/json"
    async with aiohttp.ClientSession() as http:
        kwargs: dict[str, object] = {"data": data} if data is not None else {"json": body}
        async with http.post(url + "offer", headers=headers, **kwargs) as resp:  # type: ignore[arg-type]
            text = await resp.text()
            assert "Traceback" not in text
            return resp.status, await resp.json(content_type=None), dict(resp.headers)


@pytest.mark.parametrize(
    "body",
    [
        {"sdp": "garbage", "type": "offer"},
        {"sdp": "v=0\r\nm=audio\r\n", "type": "offer"},
        {
            "sdp": "v=0\r\no=- 1 1 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\nm=audio 9 UDP/TLS/RTP/SAVPF 111\r\n",
            "type": "offer",
        },
        {"sdp": 42, "type": "offer"},
        {"type": "offer"},
        ["not", "an", "object"],
    ],
    ids=["not-sdp", "truncated", "no-ice-credentials", "sdp-not-a-string", "no-sdp", "not-an-object"],
)
async def test_a_malformed_offer_is_400(tiny_engine: Engine, body: object) -> None:
    async with tiny_server(tiny_engine) as server:
        status, reply, _ = await _post(server.url, body)
        assert status == 400, reply
        assert reply["error"] in ("bad_request", "bad_offer")
        assert tiny_engine.stats().sessions == 0  # nothing was admitted for it


async def test_a_body_that_is_not_json_is_400(tiny_engine: Engine) -> None:
    async with tiny_server(tiny_engine) as server:
        status, reply, _ = await _post(server.url, data=b"\xff{not json")
        assert (status, reply["error"]) == (400, "bad_request")


async def test_unknown_paths_and_methods_get_json_not_a_traceback(tiny_engine: Engine) -> None:
    async with tiny_server(tiny_engine) as server, aiohttp.ClientSession() as http:
        async with http.get(server.url + "favicon.ico") as resp:
            assert (resp.status, (await resp.json())["error"]) == (404, "not_found")
        async with http.get(server.url + "offer") as resp:
            assert (resp.status, (await resp.json())["error"]) == (405, "method_not_allowed")
            assert "POST" in resp.headers["Allow"]
        async with http.get(server.url) as resp:
            page = await resp.text()
            assert resp.status == 200 and 'id="start"' in page and "client.js" in page
        async with http.get(server.url + "client.js") as resp:
            assert resp.status == 200 and "RTCPeerConnection" in await resp.text()


async def test_an_oversized_body_is_413(tiny_engine: Engine) -> None:
    async with tiny_server(tiny_engine, max_body=4096) as server:
        status, reply, _ = await _post(server.url, {"sdp": "v=0\r\n" + "a" * 10_000, "type": "offer"})
        assert status == 413, reply
        assert tiny_engine.stats().sessions == 0

        async def chunks() -> AsyncIterator[bytes]:  # no Content-Length: the cap holds while reading
            for _ in range(10):
                yield b"x" * 1000

        json_type = {"Content-Type": "application/json"}
        async with (
            aiohttp.ClientSession() as http,
            http.post(server.url + "offer", data=chunks(), headers=json_type) as resp,
        ):
            assert resp.status == 413
            assert (await resp.json())["error"] == "request_entity_too_large"


async def test_a_wrong_or_missing_token_is_401_and_the_right_one_connects(tiny_engine: Engine) -> None:
    async with tiny_server(tiny_engine, token="s3cret-token") as server:
        sdp = await offer_sdp()
        for token in (None, "wrong-token", "s3cret-token-and-more"):
            status, reply, headers = await _post(server.url, {"sdp": sdp, "type": "offer"}, token=token)
            assert (status, reply["error"]) == (401, "unauthorized")
            assert headers["WWW-Authenticate"] == "Bearer"
        call = Call()
        try:
            await call.connect(server.url, token="s3cret-token")
            await call.until(lambda: call.of_type("ready"), 20)
        finally:
            await call.close()


async def test_too_many_peers_is_503_with_retry_after(tiny_engine: Engine) -> None:
    async with tiny_server(tiny_engine, max_peers=1, busy_retry_after=7.0) as server:
        first = Call()
        try:
            await first.connect(server.url)
            status, reply, headers = await _post(server.url, {"sdp": await offer_sdp(), "type": "offer"})
            assert (status, reply["error"]) == (503, "too_many_peers")
            assert headers["Retry-After"] == "7"
            assert tiny_engine.stats().sessions == 1  # the refused peer got no session
        finally:
            await first.close()


async def test_admission_rejected_is_503_with_retry_after() -> None:
    engine = make_engine(admission=AdmissionConfig(initial_limit=1, max_limit=1, queue_timeout=0.0))
    async with engine, tiny_server(engine, max_peers=4) as server:
        first = Call()
        try:
            await first.connect(server.url)
            status, reply, headers = await _post(server.url, {"sdp": await offer_sdp(), "type": "offer"})
            assert (status, reply["error"]) == (503, "admission_rejected")
            assert int(headers["Retry-After"]) >= 1
            assert engine.stats().rejected == 1
        finally:
            await first.close()


async def test_a_client_that_hangs_up_closes_its_session(tiny_engine: Engine) -> None:
    async with tiny_server(tiny_engine) as server:
        call = Call(speech=tone(0.6))
        try:
            await call.connect(server.url)
            await call.until(lambda: answered(call), 30)
            assert tiny_engine.stats().used_blocks > 0
        finally:
            await call.close()
        async with asyncio.timeout(5):
            while server.peers or tiny_engine.stats().sessions:
                await asyncio.sleep(0.05)
        assert tiny_engine.stats().used_blocks == 0


def test_server_config_checks_its_fields_and_hides_the_token() -> None:
    config = ServerConfig(token="s3cret-token")
    assert config.host == "127.0.0.1"
    assert "s3cret" not in repr(config) and "token=set" in repr(config)
    with pytest.raises(ValueError, match="port"):
        ServerConfig(port=70000)
    with pytest.raises(ValueError, match="token"):
        ServerConfig(token="short")
    with pytest.raises(ValueError, match="max_peers"):
        ServerConfig(max_peers=0)
    with pytest.raises(ValueError, match="media_timeout"):
        ServerConfig(media_timeout=float("inf"))
    assert ServerConfig().whisper_window == 10.0
    for bad in (0.5, 31, True):
        with pytest.raises(ValueError, match=r"window must be seconds in \[1, 30\]"):
            ServerConfig(whisper_window=bad)
    assert ServerConfig().whisper_workers == 2
    for bad in (0, 1.5, True):
        with pytest.raises(ValueError, match="workers must be an int >= 1"):
            ServerConfig(whisper_workers=bad)  # type: ignore[arg-type]
    assert ServerConfig().agent_options()["first_words"] == 6
    assert ServerConfig(first_words=None).agent_options()["first_words"] is None
    for words in (0, 2.5, True):
        with pytest.raises(ValueError, match="first_words must be an int >= 1, or None"):
            ServerConfig(first_words=words)  # type: ignore[arg-type]


def test_the_default_agent_answers_ahead_and_its_sessions_can_take_it_back() -> None:
    config = ServerConfig()
    assert config.agent_options()["answer_ahead"] is True and config.rewind_tokens == 96
    # answering ahead needs the pause's transcript: without hearing ahead, or with neither it nor a turn
    # to take back (history on), the sessions take no marks
    assert ServerConfig(early_transcribe=False, history=True).rewind_tokens == 0
    assert ServerConfig(answer_ahead=False, history=True).rewind_tokens == 0
    # taking each turn back once answered needs the marks too
    assert config.agent_options()["history"] is False
    assert ServerConfig(answer_ahead=False).rewind_tokens == 96
    with pytest.raises(ValueError, match="history must be True or False"):
        ServerConfig(history="no")  # type: ignore[arg-type]
