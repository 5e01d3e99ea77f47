"""Talk to ``metronome serve`` with the official OpenAI client: a stream, then a session that remembers.

Start the server first (``metronome serve``; it prints its base URL), then:

    python examples/openai_client.py [--base-url http://127.0.0.1:8000/v1]

Without a session key every request gets a session of its own. With one
(``X-Metronome-Session``) the server keeps the session between requests, so a voice
agent sends only the new turn; a 429 (the admission cap is full) carries
``retry-after-ms``, which this client waits before it retries by itself.
"""

from __future__ import annotations

import argparse
import asyncio
import os

import openai

SYSTEM = {"role": "system", "content": "Answer in one short sentence."}


async def main(base_url: str) -> None:
    api_key = os.environ.get("METRONOME_TOKEN", "unused")  # the server's token, if it was started with one
    async with openai.AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=5) as client:
        stream = await client.chat.completions.create(
            model="metronome",
            messages=[SYSTEM, {"role": "user", "content": "What is the capital of France?"}],
            stream=True,
        )
        print("stream:", end=" ", flush=True)
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                print(chunk.choices[0].delta.content, end="", flush=True)
        print()

        call = {"X-Metronome-Session": "example-call"}  # one key per call: the server keeps its context
        for question in ("I live in Rome.", "Which city do I live in?"):
            reply = await client.chat.completions.create(
                model="metronome", messages=[SYSTEM, {"role": "user", "content": question}], extra_headers=call
            )
            print(f"{question} -> {reply.choices[0].message.content}")
        # the call is over: free its session now rather than at the server's idle timeout
        await client.delete(f"/sessions/{call['X-Metronome-Session']}", cast_to=object)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base-url", default="http://127.0.0.1:8000/v1")
    asyncio.run(main(parser.parse_args().base_url))
