"""Security defaults of the signaling server: constant-time token, no secrets in logs, per-address limits,
CORS closed, loopback only."""

from __future__ import annotations

import hmac
import logging
import socket

import aiohttp
import pytest
from structlog.testing import capture_logs

from metronome_sdk import Engine
from metronome_sdk.webrtc import ServerConfig
from tests.webrtc.client import Call
from tests.webrtc.conftest import tiny_server

pytestmark = pytest.mark.timeout(60)

TOKEN = "tok-7f3a9c1e5b2d4086"
JSON = {"Content-Type": "application/json"}


async def test_the_token_is_compared_with_hmac_compare_digest_every_time(
    tiny_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[tuple[bytes, bytes]] = []
    verdict: bool | None = None  # None: the real comparison
    real = hmac.compare_digest

    def compare(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b) if verdict is None else verdict

    monkeypatch.setattr(hmac, "compare_digest", compare)
    async with tiny_server(tiny_engine, token=TOKEN) as server, aiohttp.ClientSession() as http:
        url = server.url + "offer"
        for header in ({}, {"Authorization": "Bearer wrong-token"}, {"Authorization": "Basic " + TOKEN}):
            async with http.post(url, json={}, headers=header) as resp:
                assert resp.status == 401
        # compared even when the header is missing or the scheme is wrong: timing tells nothing
        assert [b for _, b in calls] == [TOKEN.encode()] * 3
        assert [a for a, _ in calls] == [b"", b"wrong-token", TOKEN.encode()]
        # and the answer is compare_digest's: when it says no, the right token is refused too
        verdict = False
        async with http.post(url, json={}, headers={"Authorization": f"Bearer {TOKEN}"}) as resp:
            assert resp.status == 401
        verdict = None
        async with http.post(url, json={}, headers={"Authorization": f"Bearer {TOKEN}"}) as resp:
            assert (resp.status, (await resp.json())["error"]) == (400, "bad_request")  # past the token


async def test_the_token_never_appears_in_the_logs(tiny_engine: Engine, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)  # every stdlib logger (aiohttp, aiortc, ours rendered by structlog)
    async with tiny_server(tiny_engine, token=TOKEN) as server:
        async with aiohttp.ClientSession() as http:
            for token in (TOKEN, TOKEN + "x", TOKEN[:-1]):  # right, and near misses an attacker would send
                headers = {"Authorization": f"Bearer {token}"}
                async with http.post(server.url + "offer", data=b"{not json", headers={**headers, **JSON}):
                    pass
        call = Call()
        try:
            with capture_logs() as events:  # structlog's own events, before rendering
                await call.connect(server.url, token=TOKEN)
                await call.until(lambda: call.of_type("ready"), 20)
        finally:
            await call.close()
    assert any(e["event"] == "webrtc.peer_opened" for e in events)
    assert "webrtc.listening" in caplog.text  # the capture works: our events are in it
    assert TOKEN not in caplog.text
    assert all(TOKEN not in str(r.args) and TOKEN not in r.getMessage() for r in caplog.records)
    assert all(TOKEN not in repr(e) for e in events)
    assert TOKEN not in repr(server.config)


async def test_offers_per_client_address_are_limited_with_429_and_retry_after(tiny_engine: Engine) -> None:
    async with (
        tiny_server(tiny_engine, token=TOKEN, offers_per_client=3, offer_window=30.0) as server,
        aiohttp.ClientSession() as http,
    ):
        statuses = []
        with capture_logs() as logs:
            for _ in range(5):  # refused offers count too: a token cannot be guessed quickly
                async with http.post(server.url + "offer", json={}, headers={"Authorization": "Bearer guess"}) as r:
                    statuses.append(r.status)
                    last = (await r.json(), dict(r.headers))
        assert statuses == [401, 401, 401, 429, 429]
        body, headers = last
        assert body["error"] == "too_many_offers" and "3 offers per 30 s" in body["message"]
        assert 1 <= int(headers["Retry-After"]) <= 30
        assert any(e["event"] == "webrtc.client_rate_limited" for e in logs)
        # the right token does not get past the limit either
        async with http.post(server.url + "offer", json={}, headers={"Authorization": f"Bearer {TOKEN}"}) as r:
            assert r.status == 429


async def test_cors_is_closed_by_default(tiny_engine: Engine) -> None:
    origin = {"Origin": "https://evil.example"}
    async with tiny_server(tiny_engine) as server, aiohttp.ClientSession() as http:
        preflight = {
            **origin,
            "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": "content-type",
        }
        async with http.options(server.url + "offer", headers=preflight) as resp:
            assert (resp.status, (await resp.json())["error"]) == (403, "origin_not_allowed")
            assert not any(h.lower().startswith("access-control-") for h in resp.headers)
        for method, path in (("POST", "offer"), ("GET", ""), ("GET", "client.js"), ("GET", "missing")):
            async with http.request(method, server.url + path, json={}, headers=origin) as resp:
                assert "Access-Control-Allow-Origin" not in resp.headers, (method, path)
        # a cross-origin page's "simple" POST (no preflight) is refused for its content type
        form = {**origin, "Content-Type": "text/plain"}
        async with http.post(server.url + "offer", data=b'{"sdp": "v=0", "type": "offer"}', headers=form) as resp:
            assert (resp.status, (await resp.json())["error"]) == (415, "unsupported_media_type")
            assert "Access-Control-Allow-Origin" not in resp.headers


async def test_cors_opens_only_to_the_configured_origins(tiny_engine: Engine) -> None:
    app = "https://app.example"
    async with tiny_server(tiny_engine, allow_origins=(app,)) as server, aiohttp.ClientSession() as http:
        preflight = {"Origin": app, "Access-Control-Request-Method": "POST"}
        async with http.options(server.url + "offer", headers=preflight) as resp:
            assert resp.status == 204
            assert resp.headers["Access-Control-Allow-Origin"] == app
            assert resp.headers["Access-Control-Allow-Methods"] == "POST"
        async with http.post(server.url + "offer", json={}, headers={"Origin": app}) as resp:
            assert resp.status == 400 and resp.headers["Access-Control-Allow-Origin"] == app
        async with http.options(server.url + "offer", headers={**preflight, "Origin": "https://other.example"}) as r:
            assert r.status == 403 and "Access-Control-Allow-Origin" not in r.headers
    for bad in (("*",), ("https://app.example/path",), "https://app.example", ("app.example",)):
        with pytest.raises(ValueError, match="allow_origins"):
            ServerConfig(allow_origins=bad)  # type: ignore[arg-type]


async def test_the_server_binds_loopback_by_default(tiny_engine: Engine) -> None:
    assert ServerConfig().host == "127.0.0.1"
    async with tiny_server(tiny_engine) as server:
        assert server.url.startswith("http://127.0.0.1:")
        assert [host for host, _ in server.addresses] == ["127.0.0.1"]
        assert [port for _, port in server.addresses] == [server.port]
        # not reachable on another local address of this machine, if it has one
        others = {info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)}
        for address in others - {"127.0.0.1"}:
            if address.startswith("127."):
                continue
            with pytest.raises(OSError), socket.create_connection((address, server.port), timeout=1):
                pass


def test_limits_in_server_config_are_checked() -> None:
    for field, value in (("offers_per_client", 0), ("max_buffered", 0), ("offer_window", 0.0), ("offer_window", -1)):
        with pytest.raises(ValueError, match=field):
            ServerConfig(**{field: value})  # type: ignore[arg-type]
    config = ServerConfig()
    assert (config.offers_per_client, config.offer_window, config.allow_origins) == (20, 60.0, ())
    assert "allow_origins=()" in repr(config)
