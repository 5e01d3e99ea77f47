"""A LiveKit Agents LLM backed by ``metronome serve``: one Metronome session per call.

LiveKit runs each job in its own process, so the model lives in one server that every
job talks to (one shared admission cap, the weights loaded once). Start the server,
then stream two turns through LiveKit's own ``LLMStream`` (no LiveKit server needed):

    pip install "metronome-sdk[livekit]"
    metronome serve &
    python examples/livekit_agent.py [--base-url http://127.0.0.1:8000/v1]

In a worker, give ``agent_session()``'s session your STT, TTS and VAD and start it in
the job's entrypoint as usual; close the LLM when the call ends.
"""

from __future__ import annotations

import argparse
import asyncio
import os

from livekit.agents import AgentSession, APIConnectOptions, llm
from livekit.agents.voice.agent_session import SessionConnectOptions

from metronome_sdk.integrations.livekit import MetronomeLLM


def metronome_llm(base_url: str) -> MetronomeLLM:
    """One per call: its session on the server holds the conversation."""
    return MetronomeLLM(base_url=base_url, api_key=os.environ.get("METRONOME_TOKEN"), max_tokens=32)


def agent_session(base_url: str) -> AgentSession:
    """What a worker's entrypoint builds (add stt=, tts=, vad= for speech)."""
    # up to 5 tries: a full admission cap (429) is retried after the server's retry-after-ms
    retries = SessionConnectOptions(llm_conn_options=APIConnectOptions(max_retry=5))
    return AgentSession(llm=metronome_llm(base_url), conn_options=retries)


async def main(base_url: str) -> None:
    model = metronome_llm(base_url)
    try:
        chat = llm.ChatContext.empty()
        chat.add_message(role="system", content="Answer in one short sentence.")
        for question in ("What is the capital of France?", "And of Italy?"):
            chat.add_message(role="user", content=question)
            print(f"user: {question}\nbot:  ", end="", flush=True)
            reply = []
            async with model.chat(chat_ctx=chat, conn_options=APIConnectOptions(max_retry=5)) as stream:
                async for chunk in stream:
                    if chunk.delta and chunk.delta.content:
                        reply.append(chunk.delta.content)
                        print(chunk.delta.content, end="", flush=True)
            print()
            chat.add_message(role="assistant", content="".join(reply))
    finally:
        await model.aclose()  # the call is over: the server closes its session now


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    asyncio.run(main(parser.parse_args().base_url))
