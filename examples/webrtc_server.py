"""Serve voice sessions over WebRTC: open http://127.0.0.1:8080/ and press Start.

Each browser that connects gets its own Session on the embedded engine (SmolLM2-135M
with a bounded KV cache). Its speech is heard by Whisper tiny.en (wrapped by a recognizer
of this example's own), the model answers with its chat template, Piper's joe voice speaks
the answer (both from the [voice] extra); per-frame latency, voice-to-voice latency, the
admission cap and pool occupancy stream to the page. A refused peer gets HTTP 503 with Retry-After.

    python examples/webrtc_server.py [--port 8080]

Set METRONOME_TOKEN to require ``Authorization: Bearer <token>`` on POST /offer
(the page sends it when opened as http://127.0.0.1:8080/#token=<token>).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal

import metronome_sdk as metronome
from metronome_sdk.voice import WhisperSTT
from metronome_sdk.webrtc import ServerConfig, WebRTCServer


class Polite:
    """A speech-to-text wrapper: any object with ``transcribe(samples, sample_rate)`` plugs in."""

    def __init__(self, inner: WhisperSTT) -> None:
        self.inner = inner

    def transcribe(self, samples, sample_rate):  # type: ignore[no-untyped-def]
        text = self.inner.transcribe(samples, sample_rate)
        return f"{text}, please" if text else ""


async def main(port: int) -> None:
    engine_config = metronome.EngineConfig(kv="window", window=256, sinks=4)
    timing = metronome.TimingConfig(period=0.08, prompt_at_open=True)  # the prompt prefilled as a call opens
    server_config = ServerConfig(
        port=port,  # binds 127.0.0.1 unless host= says otherwise
        token=os.environ.get("METRONOME_TOKEN"),
        max_peers=4,
        system_prompt="You are a cheerful assistant. Answer in one short sentence.",
        max_reply_tokens=40,
    )
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGINT, stop.set)
    async with (
        metronome.Engine(engine_config, timing=timing) as engine,
        WebRTCServer(engine, server_config, stt=Polite(WhisperSTT())) as server,  # the default voice speaks
    ):
        print(f"open {server.url} and press Start (Ctrl-C stops)")
        await stop.wait()
    # leaving the block closed every peer connection and session, then the engine


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=8080)
    asyncio.run(main(parser.parse_args().port))
