"""Embed a Session in a voice-agent pipeline through the in-memory transport.

No network and no browser: the "caller" is a question spoken by Piper, pushed into a
``MemoryTransport`` as microphone audio. A ``VoiceAgent`` takes turns with Silero VAD,
transcribes with Whisper tiny.en, lets the session answer on the metronome and speaks with
Piper's joe voice (all from the [voice] extra); this program prints the events, the
voice-to-voice latency, and writes the agent's speech to a WAV file.
Swap ``MemoryTransport`` for your telephony or media stack: anything with
``receive_audio``, ``send_audio``, ``send_event`` and ``aclose`` is a ``Transport``.

    python examples/voice_agent.py [--out reply.wav] ["your question"]
"""

from __future__ import annotations

import argparse
import asyncio
import wave

import numpy as np

import metronome_sdk as metronome
from metronome_sdk.transports import MemoryTransport
from metronome_sdk.voice import PiperTTS, VoiceAgent, WhisperSTT, default_turn_detector


async def main(question: str, out: str) -> None:
    tts, stt = PiperTTS(), WhisperSTT()  # Piper runs as its own process (it is GPL): close it after
    caller, rate = tts.synthesize(question)  # the caller's voice: any 16-bit mono PCM works
    timing = metronome.TimingConfig(prompt_at_open=True)  # the prompt prefilled as the session opens
    async with (
        metronome.Engine(timing=timing) as engine,
        engine.session("You are a helpful assistant. Answer in one sentence.") as session,
        MemoryTransport(sample_rate=16000) as line,
    ):
        agent = VoiceAgent(session, line, stt=stt, tts=tts, vad=default_turn_detector(), max_reply_tokens=40)
        speech: list[np.ndarray] = []

        async def caller_side() -> None:
            await line.push_audio(caller, rate)
            await line.push_silence(1.0)  # a pause ends the caller's turn
            async for event in line.events():
                if event["type"] == "transcript" and event["final"]:
                    print(f"{event['role']:>9}: {event['text']}")
                elif event["type"] == "frame" and event["index"] % 8 == 0:
                    print(f"    frame {event['index']:3d}: {event['latency'] * 1e3:6.1f} ms")
                elif event["type"] == "latency":  # memory audio is not paced: turn_end is near 0 here
                    print(f"    voice-to-voice {event['voice_to_voice'] * 1e3:.0f} ms")
                elif event["type"] == "error":
                    print(f"    error {event['error']}: {event['message']}")
                if event["type"] == "transcript" and event["role"] == "assistant" and event["final"]:
                    async for chunk in line.audio():  # the answer's first sentence, spoken
                        speech.append(chunk)
                        break
                    line.hang_up()  # the caller leaves; run() returns

        try:
            async with asyncio.TaskGroup() as tg:
                tg.create_task(caller_side())
                await agent.run()
        finally:
            tts.close()
        s = engine.stats()
        print(f"engine: {s.frames} frames, p95 {1e3 * (s.latency_p95 or 0):.0f} ms, pool {s.used_blocks} blocks")
    with wave.open(out, "wb") as f:
        f.setnchannels(1)
        f.setsampwidth(2)
        f.setframerate(line.sample_rate)
        f.writeframes(np.concatenate(speech).tobytes() if speech else b"")
    print(f"the agent's spoken answer: {out}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("question", nargs="?", default="What is the capital of France?")
    parser.add_argument("--out", default="reply.wav")
    args = parser.parse_args()
    asyncio.run(main(args.question, args.out))
