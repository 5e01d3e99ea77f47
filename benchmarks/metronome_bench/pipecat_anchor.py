"""The voice anchor: a stock Pipecat pipeline of the same models, served over WebRTC to the same callers.

``metronome bench voice --anchor pipecat`` times it beside ``metronome demo``, round for round.
What a Pipecat developer builds with this project's models, Pipecat's own classes throughout:

    SmallWebRTCTransport -> WhisperSTTService -> user aggregator (Silero VAD, smart-turn v3)
    -> MetronomeLLMService -> PiperTTSService -> SmallWebRTCTransport

- the transport is Pipecat's ``SmallWebRTCTransport`` (aiortc, as the demo), signalled by
  ``POST /offer`` with the same JSON the demo takes;
- the turn is Pipecat's default: Silero VAD, then its smart-turn v3 model decides the end;
- speech to text is Pipecat's ``WhisperSTTService`` on the same Whisper tiny.en files, int8 on
  the CPU (it decodes with faster-whisper's own defaults, which it does not expose);
- the LLM is ``MetronomeLLMService`` on the demo's engine (``demo_engine``: the same model,
  threads and tick), one session a call, so the answer costs what it costs the demo;
- text to speech is Pipecat's ``PiperTTSService`` with the same joe voice (in this process: a
  benchmark, not the SDK, so Piper's GPL stays out of the SDK).

Each call's reply events are Pipecat's RTVI messages on the caller's data channel.
Run alone: ``python -m metronome_bench.pipecat_anchor --port 8090``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import sys
import warnings
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiohttp import web

__all__ = ["READY_LINE", "serve"]

READY_LINE = "pipecat anchor on"  # the line it prints once it takes calls, with its URL


@dataclass(frozen=True, slots=True)
class _Models:
    """What every call's bot reads: the demo's voice and recognizer files, its prompt and reply length."""

    voice: Path
    whisper: Path
    system_prompt: str | None
    max_tokens: int


def _models() -> _Models:
    from metronome_sdk.voice import PiperTTS, WhisperSTT
    from metronome_sdk.webrtc import ServerConfig

    demo = ServerConfig()
    # the files the demo's voice and recognizer read (neither is started here)
    return _Models(PiperTTS().voice, WhisperSTT().model, demo.system_prompt, demo.max_reply_tokens)


async def _bot(connection: Any, engine: Any, models: _Models) -> None:
    with warnings.catch_warnings():  # pipecat's audio helpers import the deprecated stdlib audioop
        warnings.simplefilter("ignore", DeprecationWarning)
        from pipecat.audio.vad.silero import SileroVADAnalyzer
        from pipecat.pipeline.pipeline import Pipeline
        from pipecat.pipeline.worker import PipelineWorker
        from pipecat.processors.aggregators.llm_context import LLMContext
        from pipecat.processors.aggregators.llm_response_universal import (
            LLMContextAggregatorPair,
            LLMUserAggregatorParams,
        )
        from pipecat.services.piper.tts import PiperTTSService
        from pipecat.services.whisper.stt import WhisperSTTService
        from pipecat.transports.base_transport import TransportParams
        from pipecat.transports.smallwebrtc.transport import SmallWebRTCTransport
        from pipecat.workers.runner import WorkerRunner

    from metronome_sdk.integrations.pipecat import MetronomeLLMService

    voice = models.voice
    transport = SmallWebRTCTransport(
        webrtc_connection=connection, params=TransportParams(audio_in_enabled=True, audio_out_enabled=True)
    )
    stt = WhisperSTTService(
        settings=WhisperSTTService.Settings(model=str(models.whisper)), device="cpu", compute_type="int8"
    )
    llm = MetronomeLLMService(engine=engine, system_prompt=models.system_prompt, max_tokens=models.max_tokens)
    tts = PiperTTSService(settings=PiperTTSService.Settings(voice=voice.stem), download_dir=voice.parent)
    context = LLMContext()
    turns = LLMContextAggregatorPair(context, user_params=LLMUserAggregatorParams(vad_analyzer=SileroVADAnalyzer()))
    pipeline = Pipeline([transport.input(), stt, turns.user(), llm, tts, transport.output(), turns.assistant()])
    worker = PipelineWorker(pipeline, idle_timeout_secs=None)

    @transport.event_handler("on_client_disconnected")  # type: ignore[untyped-decorator]
    async def _gone(_transport: Any, _client: Any) -> None:
        await worker.cancel()

    runner = WorkerRunner(handle_sigint=False)
    await runner.add_workers(worker)
    await runner.run()


@contextlib.asynccontextmanager
async def serve(host: str = "127.0.0.1", port: int = 0) -> AsyncIterator[str]:
    """Take calls at ``POST /offer`` until the block ends; yields the URL."""
    from pipecat.transports.smallwebrtc.connection import SmallWebRTCConnection

    from metronome_sdk.webrtc import demo_engine, voice_threads

    bots: set[asyncio.Task[None]] = set()
    models = _models()
    async with demo_engine(threads=voice_threads()) as engine:

        async def offer(request: web.Request) -> web.Response:
            body = await request.json()
            connection = SmallWebRTCConnection()
            await connection.initialize(sdp=body["sdp"], type=body["type"])
            bot = asyncio.ensure_future(_bot(connection, engine, models))
            bots.add(bot)
            bot.add_done_callback(bots.discard)
            return web.json_response(connection.get_answer())  # type: ignore[no-untyped-call]

        async def alive(_request: web.Request) -> web.Response:
            return web.Response(text="ok")

        app = web.Application()
        app.router.add_post("/offer", offer)
        app.router.add_get("/", alive)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, host, port)
        await site.start()
        bound = runner.addresses[0][1]  # the port asked for, or the free one picked for 0
        try:
            yield f"http://{host}:{bound}/"
        finally:
            for bot in list(bots):
                bot.cancel()
            await asyncio.gather(*bots, return_exceptions=True)
            await runner.cleanup()


async def _main(port: int) -> None:
    async with serve(port=port) as url:
        print(f"{READY_LINE} {url}", flush=True)
        await asyncio.Event().wait()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--port", type=int, default=0, help="port to listen on (default 0: a free one)")
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_main(parser.parse_args().port))
    sys.exit(0)
