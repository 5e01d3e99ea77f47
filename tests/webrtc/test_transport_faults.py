"""Transport faults: each ends one peer's session cleanly, returns its blocks, and the other peer keeps its beat.

Every test has a bystander: a second peer, connected before the fault and idle through it,
which must keep receiving its ``stats`` events on time, and must get an answer afterwards.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aioice.ice
import numpy as np
import pytest
from structlog.testing import capture_logs

from metronome_sdk import Engine
from metronome_sdk.webrtc import ReplyAudioTrack, WebRTCServer
from tests.webrtc.client import Call, answered, tone
from tests.webrtc.conftest import tiny_server

pytestmark = pytest.mark.timeout(90)

ROOT = Path(__file__).resolve().parents[2]
MAX_STATS_GAP = 2.5  # seconds; the server sends stats every 0.5 s, a loaded 2-core CI box may lag a little


async def _bystander(server: WebRTCServer) -> Call:
    call = Call()
    await call.connect(server.url)
    await call.until(lambda: call.of_type("ready"), 20)
    return call


async def _victim_talks(server: WebRTCServer, engine: Engine, base_blocks: int) -> Call:
    victim = Call(speech=tone(0.6))
    await victim.connect(server.url)
    await victim.until(lambda: answered(victim), 30)
    assert engine.stats().used_blocks > base_blocks  # its session holds blocks: the fault must return them
    return victim


@contextlib.asynccontextmanager
async def _victim_beside_a_bystander(server: WebRTCServer, engine: Engine) -> AsyncIterator[tuple[Call, Call, int]]:
    """A bystander connects, then a victim talks; yields (victim, bystander, the bystander's blocks)."""
    bystander = await _bystander(server)
    victim: Call | None = None
    try:
        base = engine.stats().used_blocks
        victim = await _victim_talks(server, engine, base)
        yield victim, bystander, base
    finally:
        if victim is not None:
            await victim.close()
        await bystander.close()


async def _until_only_the_bystander_is_left(server: WebRTCServer, engine: Engine, timeout: float) -> None:
    async with asyncio.timeout(timeout):
        while server.peers > 1 or engine.stats().sessions > 1:
            await asyncio.sleep(0.05)


async def _assert_the_bystander_kept_its_beat(bystander: Call, since: float) -> None:
    await bystander.until(lambda: len(bystander.stats_gaps(since)) >= 3, 10)  # and it goes on after the fault
    gaps = bystander.stats_gaps(since)
    assert max(gaps) < MAX_STATS_GAP, gaps
    bystander.microphone.say(tone(0.6))
    await bystander.until(lambda: answered(bystander), 30)
    assert not bystander.of_type("error") and not bystander.of_type("closed"), bystander.events


def _event(logs: list[dict[str, Any]], name: str) -> dict[str, Any]:
    found = [e for e in logs if e["event"] == name]
    assert found, [e["event"] for e in logs]
    return found[0]


async def test_ice_failure_breaks_the_session_returns_its_blocks_and_others_keep_their_beat(
    tiny_engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> None:
    # consent freshness (RFC 7675) every ~0.2 s instead of 5: a dark peer fails ICE in ~4 s, not 30
    monkeypatch.setattr(aioice.ice, "CONSENT_INTERVAL", 0.2)
    async with (
        tiny_server(tiny_engine, media_timeout=60.0) as server,  # so ICE, not silence, is what ends it
        _victim_beside_a_bystander(server, tiny_engine) as (victim, bystander, base),
    ):
        since = time.monotonic()
        with capture_logs() as logs:
            victim.go_dark()
            await _until_only_the_bystander_is_left(server, tiny_engine, 30)
        assert {e["state"] for e in logs if e["event"] == "webrtc.connection"} & {"failed", "closed"}
        assert _event(logs, "webrtc.peer_ended")["reason"] == "ice_failed"
        failed = _event(logs, "webrtc.session_failed")
        assert (failed["error"], failed["reason"]) == ("SessionBroken", "ice_failed")
        assert tiny_engine.stats().used_blocks == base
        await _assert_the_bystander_kept_its_beat(bystander, since)


async def test_a_data_channel_closed_mid_call_hangs_up_and_returns_the_blocks(tiny_engine: Engine) -> None:
    async with (
        tiny_server(tiny_engine) as server,
        _victim_beside_a_bystander(server, tiny_engine) as (victim, bystander, base),
    ):
        since = time.monotonic()
        with capture_logs() as logs:
            victim.channel.close()  # the peer's events channel is gone; its audio still flows
            await _until_only_the_bystander_is_left(server, tiny_engine, 15)
        assert _event(logs, "webrtc.peer_ended")["reason"] == "channel_closed"
        assert _event(logs, "webrtc.peer_closed")["ended_by"] == "channel_closed"
        assert not [e for e in logs if e["event"] == "webrtc.session_failed"]  # a hang-up, not a failure
        assert tiny_engine.stats().used_blocks == base
        async with asyncio.timeout(10):  # the server hung up the whole call
            while victim.pc.connectionState not in ("closed", "failed"):
                await asyncio.sleep(0.05)
        await _assert_the_bystander_kept_its_beat(bystander, since)


async def test_a_peer_that_stops_reading_is_shed_and_returns_its_blocks(tiny_engine: Engine) -> None:
    async with (
        tiny_server(tiny_engine, max_buffered=1024) as server,
        _victim_beside_a_bystander(server, tiny_engine) as (victim, bystander, base),
    ):
        since = time.monotonic()
        with capture_logs() as logs:
            victim.stop_reading()
            victim.microphone.say(tone(0.6))  # a turn: frame and transcript events pile up unread
            await _until_only_the_bystander_is_left(server, tiny_engine, 40)
        shed = _event(logs, "webrtc.slow_consumer")
        assert shed["buffered"] > shed["limit"] == 1024
        failed = _event(logs, "webrtc.session_failed")
        assert (failed["error"], failed["reason"]) == ("SessionBroken", "slow_consumer")
        assert tiny_engine.stats().used_blocks == base
        await _assert_the_bystander_kept_its_beat(bystander, since)


async def test_a_vanished_client_closes_its_session_and_returns_its_blocks(tiny_engine: Engine) -> None:
    async with tiny_server(tiny_engine, media_timeout=1.5) as server:
        bystander = await _bystander(server)
        base = tiny_engine.stats().used_blocks
        # a client in another process that has talked (its session holds blocks), then is killed mid-frame
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.webrtc.client", server.url], cwd=ROOT, stdout=subprocess.PIPE, text=True
        )
        try:
            try:
                assert proc.stdout is not None
                line = await asyncio.wait_for(asyncio.to_thread(proc.stdout.readline), 40)
                assert line.strip() == "answered"
                during = tiny_engine.stats()
                assert during.sessions == 2
                assert during.used_blocks > base
            finally:
                os.kill(proc.pid, signal.SIGKILL)
                proc.wait(10)
                if proc.stdout is not None:
                    proc.stdout.close()
            since = time.monotonic()
            with capture_logs() as logs:
                await _until_only_the_bystander_is_left(server, tiny_engine, 15)
            assert _event(logs, "webrtc.peer_vanished")["silent_for"] == 1.5
            failed = _event(logs, "webrtc.session_failed")
            assert (failed["error"], failed["reason"]) == ("SessionBroken", "peer_vanished")
            assert tiny_engine.stats().used_blocks == base
            await _assert_the_bystander_kept_its_beat(bystander, since)
        finally:
            await bystander.close()
    async with asyncio.timeout(5):
        while tiny_engine.stats().sessions:
            await asyncio.sleep(0.05)
    assert tiny_engine.stats().used_blocks == 0


async def test_the_reply_track_holds_at_most_its_cap_and_drops_the_oldest_speech() -> None:
    track = ReplyAudioTrack(sample_rate=8000, frame_seconds=1.0, max_queued_seconds=1.0)
    first = np.full(8000, 1, dtype=np.int16)
    second = np.full(12000, 2, dtype=np.int16)
    track.enqueue(first, 8000)
    track.enqueue(second, 8000)
    assert track.queued_seconds == 1.0
    assert track.samples_dropped == 12000
    frame = await track.recv()  # the first frame goes at once: all that is queued
    assert frame.samples == 8000 and (frame.to_ndarray() == 2).all()  # what is left is the newest speech
    assert track.queued_seconds == 0.0 and track.samples_sent == 8000
    with pytest.raises(ValueError, match="max_queued_seconds"):
        ReplyAudioTrack(max_queued_seconds=0.0)
