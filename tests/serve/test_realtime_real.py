"""``/v1/realtime`` with the real voice and weights, through the official ``openai`` client.

Piper speaks the question at run time; it is streamed as ``input_audio_buffer.append`` events
(100 ms each, faster than real time); the server's turn detector (Silero), Whisper tiny.en,
SmolLM2 and Piper answer it. What is asserted is what a client relies on: the events' order,
the words, and that no audio delta of a cancelled response comes after its ``response.done``.
The time from ``response.cancel`` to the last delta is printed, not asserted (a shared CPU).
"""

from __future__ import annotations

import base64
import time
import warnings
from collections.abc import AsyncIterator
from typing import Any

import anyio
import numpy as np
import numpy.typing as npt
import openai
import pytest

from metronome_sdk import Engine
from metronome_sdk._audio import resample
from metronome_sdk.serve import ChatServer, RealtimeConfig, ServeConfig
from metronome_sdk.webrtc import demo_engine
from tests.serve.test_realtime_clients import load_example
from tests.webrtc.conftest import speak

pytestmark = [pytest.mark.real_model, pytest.mark.slow, pytest.mark.timeout(420)]

RATE = 24000
QUESTION = "What is the capital of France?"


@pytest.fixture
async def voice_server() -> AsyncIterator[ChatServer]:
    # started, not entered: pytest-asyncio tears a fixture down in another task than set it up
    engine: Engine = demo_engine()
    server = ChatServer(engine, ServeConfig(port=0, realtime=RealtimeConfig()))
    await server.start()
    try:
        yield server
        with anyio.fail_after(10):  # the connection's handler closes its session as it ends
            while engine.stats().sessions or engine.stats().used_blocks:  # and its blocks go back to the pool
                await anyio.sleep(0.05)
    finally:
        await server.aclose()
        await engine.aclose()


def question() -> npt.NDArray[np.int16]:
    pcm, rate = speak(QUESTION)
    return np.concatenate([resample(pcm, rate, RATE), np.zeros(RATE, dtype=np.int16)])  # then a second of quiet


async def ask(conn: Any, speech: npt.NDArray[np.int16]) -> None:
    for i in range(0, speech.size, RATE // 10):
        chunk = speech[i : i + RATE // 10]
        await conn.input_audio_buffer.append(audio=base64.b64encode(chunk.astype("<i2").tobytes()).decode())
        await anyio.sleep(0.05)  # twice real time: real-time-ish, as a microphone would send it


async def test_the_openai_client_asks_by_voice_hears_paris_and_cancels_an_answer(
    voice_server: ChatServer, capsys: pytest.CaptureFixture[str]
) -> None:
    speech = question()
    async with (
        openai.AsyncOpenAI(base_url=voice_server.url, api_key="unused") as client,
        client.realtime.connect(model="metronome") as conn,
    ):
        await conn.session.update(
            session={
                "type": "realtime",
                "instructions": "Answer the question in one short English sentence.",
                "audio": {"input": {"turn_detection": {"type": "server_vad"}}},
            }
        )
        # turn 1: the whole answer
        events: list[Any] = []
        arrived: dict[str, float] = {}  # each event type's first arrival
        with anyio.fail_after(180):
            async with anyio.create_task_group() as tg:
                tg.start_soon(ask, conn, speech)
                async for event in conn:
                    events.append(event)
                    arrived.setdefault(event.type, time.monotonic())
                    if event.type == "response.done":
                        break
        kinds = [e.type for e in events]
        for kind in (
            "session.created",
            "input_audio_buffer.speech_started",
            "input_audio_buffer.speech_stopped",
            "conversation.item.input_audio_transcription.completed",
            "response.created",
            "response.output_audio.delta",
            "response.done",
        ):
            assert kind in kinds, (kind, kinds)
        assert kinds.index("input_audio_buffer.speech_stopped") < kinds.index("response.created")
        heard = next(e for e in events if e.type == "conversation.item.input_audio_transcription.completed")
        assert "capital" in heard.transcript.lower() and "france" in heard.transcript.lower(), heard.transcript
        answer = "".join(e.delta for e in events if e.type == "response.output_audio_transcript.delta")
        assert "Paris" in answer, answer
        audio = b"".join(base64.b64decode(e.delta) for e in events if e.type == "response.output_audio.delta")
        assert len(audio) / 2 / RATE > 0.5, len(audio)  # seconds of speech
        done = events[-1]
        assert done.response.status == "completed"
        stopped = arrived["input_audio_buffer.speech_stopped"]
        with capsys.disabled():
            print(
                f"\nspeech_stopped -> transcript "
                f"{1000 * (arrived['conversation.item.input_audio_transcription.completed'] - stopped):.0f} ms, "
                f"-> first audio delta {1000 * (arrived['response.output_audio.delta'] - stopped):.0f} ms"
            )

        # turn 2: the same question, cancelled at its first audio delta
        events = []
        cancelled_at = math_nan = float("nan")
        with anyio.fail_after(180):
            async with anyio.create_task_group() as tg:
                tg.start_soon(ask, conn, speech)
                async for event in conn:
                    events.append((time.monotonic(), event))
                    if event.type == "response.output_audio.delta" and cancelled_at is math_nan:
                        cancelled_at = time.monotonic()
                        await conn.response.cancel()
                    if event.type == "response.done":
                        break
            # nothing of it comes after its response.done
            with anyio.move_on_after(1.5):
                async for event in conn:
                    events.append((time.monotonic(), event))
        kinds = [e.type for _, e in events]
        done_at = kinds.index("response.done")
        assert events[done_at][1].response.status == "cancelled"
        assert "response.output_audio.delta" not in kinds[done_at + 1 :]
        deltas = [t for t, e in events if e.type == "response.output_audio.delta"]
        full = len(audio) / 2 / RATE
        sent = sum(len(base64.b64decode(e.delta)) for _, e in events if e.type == "response.output_audio.delta")
        with capsys.disabled():
            print(
                f"\nresponse.cancel: last audio delta {1000 * (deltas[-1] - cancelled_at):.0f} ms after the cancel "
                f"was sent, {len(deltas)} deltas ({sent / 2 / RATE:.2f} s of audio) of a {full:.2f} s answer; "
                f"response.done {1000 * (events[done_at][0] - cancelled_at):.0f} ms after it"
            )


async def test_the_realtime_clients_example_hears_paris_from_each_client(
    voice_server: ChatServer, capsys: pytest.CaptureFixture[str]
) -> None:
    with anyio.fail_after(300), warnings.catch_warnings():
        warnings.filterwarnings("ignore", "'audioop' is deprecated", DeprecationWarning)
        await load_example().main(voice_server.url)
    printed = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in printed] == ["openai", "pipecat", "livekit"], printed
    assert all("Paris" in line for line in printed), printed
    with capsys.disabled():
        print("\n" + "\n".join(printed))
