"""The load test: 4x the admission cap of concurrent OpenAI-client streams against ``ChatServer``.

Every request must either complete (a finish reason, then ``[DONE]``) or be refused with
429 and ``retry-after-ms`` (then its caller waits that long and asks again); none may
hang (a client timeout) or end any other way, and the pool is back to zero at the end.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import anyio
import httpx2
import openai

from metronome_sdk import Engine
from metronome_sdk.serve import ChatServer, ServeConfig

QUESTION = [{"role": "user", "content": "Name one colour of the rainbow."}]


@dataclass
class LoadReport:
    seconds: float
    streams: int  # concurrent callers
    cap: int  # the admission cap when the load began
    completed: int = 0
    refused: int = 0  # 429 with retry-after-ms
    refused_without_advice: int = 0
    hung: int = 0  # client timeouts
    failed: list[str] = field(default_factory=list)  # any other end
    longest: float = 0.0  # seconds, the slowest completed request
    sessions_after: int = -1
    used_blocks_after: int = -1

    @property
    def ok(self) -> bool:
        return (
            self.completed > 0
            and self.refused_without_advice == 0
            and self.hung == 0
            and not self.failed
            and self.sessions_after == 0
            and self.used_blocks_after == 0
        )

    def __str__(self) -> str:
        return (
            f"load: {self.streams} streams (4 x cap {self.cap}) for {self.seconds:.0f} s: {self.completed} completed "
            f"(slowest {self.longest:.1f} s), {self.refused} refused with retry-after-ms, "
            f"{self.refused_without_advice} refused without, {self.hung} hung, {len(self.failed)} failed "
            f"{self.failed[:3]}; after: {self.sessions_after} sessions, {self.used_blocks_after} blocks in use"
        )


async def run_load(engine: Engine, *, seconds: float, max_tokens: int, request_timeout: float = 60.0) -> LoadReport:
    cap = engine.stats().limit
    report = LoadReport(seconds=seconds, streams=4 * cap, cap=cap)
    config = ServeConfig(port=0, max_tokens=max_tokens)
    async with ChatServer(engine, config) as server:
        timeout = httpx2.Timeout(request_timeout, connect=5.0)
        async with openai.AsyncOpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=timeout) as c:
            stop_at = time.monotonic() + seconds

            async def caller() -> None:
                while time.monotonic() < stop_at:
                    began = time.monotonic()
                    try:
                        stream = await c.chat.completions.create(model="m", messages=QUESTION, stream=True)
                        finish = None
                        async for chunk in stream:
                            if chunk.choices and chunk.choices[0].finish_reason:
                                finish = chunk.choices[0].finish_reason
                        if finish in ("stop", "length"):
                            report.completed += 1
                            report.longest = max(report.longest, time.monotonic() - began)
                        else:
                            report.failed.append(f"a stream ended without a finish reason ({finish!r})")
                    except openai.RateLimitError as exc:
                        advice = exc.response.headers.get("retry-after-ms")
                        if advice is None:
                            report.refused_without_advice += 1
                            await asyncio.sleep(0.1)
                        else:
                            report.refused += 1
                            await asyncio.sleep(int(advice) / 1000)
                    except openai.APITimeoutError:
                        report.hung += 1
                    except openai.APIError as exc:
                        report.failed.append(repr(exc)[:200])

            async with anyio.create_task_group() as tg:
                for _ in range(report.streams):
                    tg.start_soon(caller)
    with anyio.fail_after(30):  # sessions close as their handlers return
        while engine.stats().sessions:
            await asyncio.sleep(0.05)
    stats = engine.stats()
    report.sessions_after, report.used_blocks_after = stats.sessions, stats.used_blocks
    return report
