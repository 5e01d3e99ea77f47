"""Signaling bodies fuzzed with hypothesis: never a 500, never a traceback, always a JSON reason."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from metronome_sdk import Engine
from metronome_sdk.webrtc import WebRTCServer
from tests.webrtc.client import Call, offer_sdp
from tests.webrtc.conftest import tiny_server

pytestmark = pytest.mark.timeout(120)

TOKEN = "fuzz-token-0123456789"
MAX_BODY = 4096
FUZZ = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# an offer as a browser sends it: the fuzzer cuts, repeats and garbles its lines
OFFER = (
    "v=0\r\no=- 3906151233 3906151233 IN IP4 0.0.0.0\r\ns=-\r\nt=0 0\r\na=group:BUNDLE 0 1\r\n"
    "a=msid-semantic:WMS *\r\nm=audio 9 UDP/TLS/RTP/SAVPF 96 0 8\r\nc=IN IP4 0.0.0.0\r\n"
    "a=sendrecv\r\na=mid:0\r\na=msid:a b\r\na=rtcp:9 IN IP4 0.0.0.0\r\na=rtcp-mux\r\n"
    "a=ssrc:1 cname:x\r\na=rtpmap:96 opus/48000/2\r\na=rtpmap:0 PCMU/8000\r\na=rtpmap:8 PCMA/8000\r\n"
    "a=candidate:1 1 udp 2130706431 127.0.0.1 50000 typ host\r\na=end-of-candidates\r\n"
    "a=ice-ufrag:abcd\r\na=ice-pwd:abcdefghijklmnopqrstuv\r\n"
    "a=fingerprint:sha-256 " + ":".join(["AB"] * 32) + "\r\na=setup:actpass\r\n"
    "m=application 9 DTLS/SCTP 5000\r\nc=IN IP4 0.0.0.0\r\na=mid:1\r\na=sctpmap:5000 webrtc-datachannel 65535\r\n"
    "a=max-message-size:65536\r\na=candidate:1 1 udp 2130706431 127.0.0.1 50000 typ host\r\n"
    "a=end-of-candidates\r\na=ice-ufrag:abcd\r\na=ice-pwd:abcdefghijklmnopqrstuv\r\n"
    "a=fingerprint:sha-256 " + ":".join(["AB"] * 32) + "\r\na=setup:actpass\r\n"
)
LINES = OFFER.split("\r\n")[:-1]


@st.composite
def garbled_offers(draw: st.DrawFn) -> str:
    lines = list(LINES)
    for _ in range(draw(st.integers(0, 4))):
        i = draw(st.integers(0, len(lines) - 1))
        action = draw(st.sampled_from(["drop", "repeat", "garble", "truncate", "insert"]))
        if action == "drop":
            del lines[i]
        elif action == "repeat":
            lines.insert(i, lines[i])
        elif action == "garble":
            key, _, _ = lines[i].partition("=")
            lines[i] = key + "=" + draw(st.text(max_size=40))
        elif action == "truncate":
            lines[i] = lines[i][: draw(st.integers(0, len(lines[i])))]
        else:
            lines.insert(i, draw(st.text(max_size=30)))
        if not lines:
            break
    return draw(st.sampled_from(["\r\n", "\n"])).join(lines) + "\r\n"


JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
SDPS = st.one_of(
    garbled_offers(), st.text(max_size=200).map(lambda t: "v=0\r\n" + t), st.text(max_size=200), JSON_VALUES
)
OFFER_BODIES = st.one_of(
    st.fixed_dictionaries({"sdp": SDPS, "type": st.sampled_from(["offer", "answer", "", "OFFER"]) | JSON_VALUES}),
    st.fixed_dictionaries({"sdp": SDPS}, optional={"type": st.just("offer"), "extra": JSON_VALUES}),
    JSON_VALUES,
).map(lambda body: json.dumps(body).encode())
BODIES = st.one_of(
    OFFER_BODIES,
    st.binary(max_size=300),
    st.integers(MAX_BODY + 1, 4 * MAX_BODY).map(lambda n: b'{"sdp": "' + b"a" * n + b'", "type": "offer"}'),
)
CONTENT_TYPES = st.sampled_from(
    [
        "application/json",
        "application/json; charset=utf-8",
        "text/plain",
        "application/x-www-form-urlencoded",
        "multipart/form-data; boundary=x",
        "application/sdp",
        "",
        "json",
    ]
)
PRINTABLE = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=40)
AUTHS = st.one_of(st.just(f"Bearer {TOKEN}"), st.none(), PRINTABLE, PRINTABLE.map(lambda t: "Bearer " + t))
ALLOWED = {400, 401, 413, 415, 503}


@pytest.fixture
async def fuzz_server(tiny_engine: Engine) -> AsyncIterator[WebRTCServer]:
    # a peer the fuzzer's SDP got admitted (it never connects) is gone after media_timeout
    server = tiny_server(
        tiny_engine, token=TOKEN, max_body=MAX_BODY, max_peers=32, offers_per_client=10_000, media_timeout=1.0
    )
    await server.start()
    yield server
    await server.aclose()


def _check_refusal(status: int, text: str, headers: Any) -> dict[str, Any]:
    assert "Traceback" not in text and 'File "' not in text
    reply = json.loads(text)
    assert isinstance(reply, dict) and isinstance(reply.get("error"), str) and isinstance(reply.get("message"), str)
    if status == 503:
        assert int(headers["Retry-After"]) >= 1
    return reply


async def _post(server: WebRTCServer, body: bytes, content_type: str, auth: str | None) -> tuple[int, str, Any]:
    headers = {"Content-Type": content_type} if content_type else {}
    if auth is not None:
        headers["Authorization"] = auth
    async with (
        aiohttp.ClientSession(skip_auto_headers=["Content-Type"]) as http,
        http.post(server.url + "offer", data=body, headers=headers) as resp,
    ):
        return resp.status, await resp.text(), resp.headers


@FUZZ
@given(body=OFFER_BODIES)
async def test_fuzzed_offer_bodies_get_an_answer_or_a_clear_400(fuzz_server: WebRTCServer, body: bytes) -> None:
    status, text, headers = await _post(fuzz_server, body, "application/json", f"Bearer {TOKEN}")
    if status == 200:  # an offer aiortc could take: an answer, not an error
        assert json.loads(text)["type"] == "answer"
        return
    reply = _check_refusal(status, text, headers)
    assert (status, reply["error"]) in {(400, "bad_request"), (400, "bad_offer"), (503, "admission_rejected")}, reply


@FUZZ
@given(body=BODIES, content_type=CONTENT_TYPES, auth=AUTHS)
async def test_fuzzed_requests_get_a_clear_4xx_never_a_500(
    fuzz_server: WebRTCServer, body: bytes, content_type: str, auth: str | None
) -> None:
    status, text, headers = await _post(fuzz_server, body, content_type, auth)
    if status == 200:
        assert auth == f"Bearer {TOKEN}" and json.loads(text)["type"] == "answer"
        return
    assert status in ALLOWED, (status, text)
    reply = _check_refusal(status, text, headers)
    if auth != f"Bearer {TOKEN}":
        assert (status, reply["error"]) == (401, "unauthorized")
    elif len(body) > MAX_BODY:
        assert status == 413
    elif not content_type.startswith("application/json"):
        assert (status, reply["error"]) == (415, "unsupported_media_type")
    else:
        assert status in (400, 503), (status, reply)


async def test_many_concurrent_offers_never_exceed_the_caps_and_leave_nothing_behind(tiny_engine: Engine) -> None:
    async with tiny_server(tiny_engine, max_peers=2, offers_per_client=12) as server, aiohttp.ClientSession() as http:
        offers = [{"sdp": await offer_sdp(), "type": "offer"} for _ in range(4)]

        async def post(i: int) -> int:
            async with http.post(server.url + "offer", json=offers[i % len(offers)]) as resp:
                if resp.status != 200:
                    _check_refusal(resp.status, await resp.text(), resp.headers)
                return resp.status

        statuses = await asyncio.gather(*(post(i) for i in range(16)))
        assert statuses.count(200) == 2, statuses  # exactly the peer cap, no matter the interleaving
        assert statuses.count(429) == 4  # the 13th to 16th offer from this address
        assert set(statuses) <= {200, 429, 503}
        assert server.peers == 2 and tiny_engine.stats().sessions == 2
    assert server.peers == 0
    async with asyncio.timeout(5):
        while tiny_engine.stats().sessions:
            await asyncio.sleep(0.05)
    assert tiny_engine.stats().used_blocks == 0


async def test_a_good_offer_still_connects_after_the_fuzzing(fuzz_server: WebRTCServer) -> None:
    call = Call()
    try:
        await call.connect(fuzz_server.url, token=TOKEN)
        await call.until(lambda: call.of_type("ready"), 20)
    finally:
        await call.close()
