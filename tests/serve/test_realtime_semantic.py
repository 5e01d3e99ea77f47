"""``semantic_vad`` on ``/v1/realtime``: the words model ends a turn at a short pause, else a longer silence does."""

from __future__ import annotations

import time
from typing import Any

import aiohttp
import anyio
import numpy as np
import pytest

from metronome_sdk import Engine
from metronome_sdk.serve import RealtimeConfig
from tests.serve.test_realtime import _connect, b64, quiet, realtime_server, tone
from tests.voice.test_text_turn import Words

pytestmark = pytest.mark.timeout(180)
SEMANTIC = {"type": "session.update", "session": {"audio": {"input": {"turn_detection": {"type": "semantic_vad"}}}}}


async def _speak(client: object, *parts: np.ndarray) -> None:
    for chunk in np.array_split(np.concatenate(parts), 10):
        await client.send({"type": "input_audio_buffer.append", "audio": b64(chunk)})  # type: ignore[attr-defined]


async def _quiet_until(client: Any, kind: str, *, limit: float) -> float:
    """Stream quiet as a microphone does (a frame gap would end the turn by itself) until ``kind``; its wait."""
    began = time.monotonic()
    async with anyio.create_task_group() as tg:

        async def microphone() -> None:
            while True:
                await client.send({"type": "input_audio_buffer.append", "audio": b64(quiet(0.05))})
                await anyio.sleep(0.05)

        tg.start_soon(microphone)
        await client.until(kind, timeout=limit)
        tg.cancel_scope.cancel()
    return time.monotonic() - began


async def _one_turn(engine: Engine, words: Words, *, silence: float, semantic: bool) -> tuple[float, list[Any]]:
    """Speak a tone, then stream quiet until the turn ends: the wait, and every event the client saw."""
    async with (
        realtime_server(engine, text_turn=words, semantic_silence=silence) as server,
        aiohttp.ClientSession() as http,
    ):
        client = await _connect(http, server)
        await client.until("session.created")
        if semantic:
            await client.send(SEMANTIC)
            updated = await client.until("session.updated")
            assert updated["session"]["audio"]["input"]["turn_detection"]["type"] == "semantic_vad"
        await _speak(client, tone(0.8))
        waited = await _quiet_until(client, "input_audio_buffer.speech_stopped", limit=20)
        await client.until("response.done")
        await client.ws.close()
    return waited, client.seen


async def test_semantic_vad_ends_the_turn_when_the_words_read_finished(engine: Engine) -> None:
    words = Words(finished=True)
    # the silence under semantic_vad is 3 s: a turn ended by 0.6 s of quiet was ended by the words
    waited, seen = await _one_turn(engine, words, silence=3.0, semantic=True)
    [heard] = [e for e in seen if e["type"] == "conversation.item.input_audio_transcription.completed"]
    assert heard["transcript"] == "hello" and words.read == ["hello"]
    assert waited < 2.0  # not the 3 s silence: the words ended it


async def test_semantic_vad_waits_out_its_longer_silence_when_the_words_read_unfinished(engine: Engine) -> None:
    words = Words(finished=False)
    waited, _ = await _one_turn(engine, words, silence=1.5, semantic=True)
    assert words.read == ["hello"]
    assert waited >= 1.4  # server_vad's 0.3 s here would have ended it long before


async def test_server_vad_does_not_ask_the_words_model(engine: Engine) -> None:
    words = Words(finished=False)
    # server_vad: the detector's own 0.3 s of silence ends it
    waited, _ = await _one_turn(engine, words, silence=3.0, semantic=False)
    assert words.read == [] and waited < 1.4


def test_semantic_silence_is_checked() -> None:
    for bad in (0, -1.0, 11.0, True):
        with pytest.raises(ValueError, match="semantic_silence"):
            RealtimeConfig(semantic_silence=bad)
