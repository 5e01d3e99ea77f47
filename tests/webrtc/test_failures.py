"""When the engine fails a session, the peer hears why (an event), then the call ends: never silence."""

from __future__ import annotations

import asyncio

import pytest

from metronome_engine import KVPolicy
from metronome_sdk import LoadShed, Session
from metronome_sdk.transports import Transport
from metronome_sdk.webrtc import ServerConfig, WebRTCServer
from tests.sdk.conftest import make_engine
from tests.webrtc.client import Call, tone
from tests.webrtc.conftest import tiny_server

pytestmark = pytest.mark.timeout(60)


async def test_a_stalled_session_gets_an_error_event_then_a_clean_close() -> None:
    # the full policy on a pool of 6 blocks of 4 tokens: the first turn's prefill cannot fit
    engine = make_engine(KVPolicy.full(), num_blocks=6, block_size=4)
    await engine.start()
    try:
        async with tiny_server(engine) as server:
            call = Call(speech=tone(0.6))
            try:
                await call.connect(server.url)
                await call.until(lambda: call.of_type("closed"), 30)
                error = call.of_type("error")
                assert error, call.events
                assert error[0]["error"] in ("EngineStalled", "CacheExhausted")
                assert error[0]["retryable"] is False
                assert call.events[-1] == {"type": "closed", "reason": error[0]["error"]}
                assert not any(e["role"] == "assistant" for e in call.of_type("transcript"))
                async with asyncio.timeout(10):  # the server hung up: the connection closes
                    while call.pc.connectionState not in ("closed", "failed"):
                        await asyncio.sleep(0.05)
            finally:
                await call.close()
            async with asyncio.timeout(5):
                while server.peers or engine.stats().sessions:
                    await asyncio.sleep(0.05)
            assert engine.stats().used_blocks == 0
    finally:
        await engine.aclose()


async def test_server_shutdown_tells_every_peer_and_closes_its_connection() -> None:
    engine = make_engine()
    await engine.start()
    try:
        server = tiny_server(engine)
        await server.start()
        call = Call()
        try:
            await call.connect(server.url)
            await call.until(lambda: call.of_type("ready"), 20)
            await server.aclose()
            assert server.peers == 0
            assert engine.stats().sessions == 0
            await call.until(lambda: call.of_type("closed"), 5)
            assert call.of_type("closed")[0]["reason"] == "server_shutdown"
        finally:
            await call.close()
            await server.aclose()
    finally:
        await engine.aclose()


async def test_an_engine_that_closes_tells_its_idle_peers() -> None:
    engine = make_engine()
    await engine.start()
    async with tiny_server(engine) as server:
        call = Call()
        try:
            await call.connect(server.url)
            await call.until(lambda: call.of_type("ready"), 20)
            await engine.aclose()  # the session is listening, not stepping: it still hears of it
            await call.until(lambda: call.of_type("closed"), 5)
            assert call.of_type("error")[0]["error"] == "SessionClosed"
            assert call.of_type("closed")[0]["reason"] == "SessionClosed"
            async with asyncio.timeout(5):
                while server.peers:
                    await asyncio.sleep(0.05)
        finally:
            await call.close()


async def test_a_custom_handler_that_fails_is_reported_to_the_peer() -> None:
    engine = make_engine()
    await engine.start()

    async def handler(session: Session, transport: Transport) -> None:
        await transport.send_event({"type": "ready", "session_id": session.id})
        raise LoadShed("shed to protect the others", retry_after=2.0, limit=1, in_flight=1)

    try:
        async with WebRTCServer(engine, ServerConfig(port=0), handler=handler) as server:
            call = Call()
            try:
                await call.connect(server.url)
                await call.until(lambda: call.of_type("closed"), 20)
                error = call.of_type("error")[0]
                assert (error["error"], error["retryable"], error["retry_after"]) == ("LoadShed", True, 2.0)
            finally:
                await call.close()
            async with asyncio.timeout(5):
                while server.peers or engine.stats().sessions:
                    await asyncio.sleep(0.05)
    finally:
        await engine.aclose()
