from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field

import pytest
from aiohttp import web

from metronome_sdk import Engine
from metronome_sdk.serve import ChatServer, ServeConfig
from tests.sdk.conftest import make_engine

TOKEN = "serve-test-token"


@dataclass
class Seen:
    """What the server answered, request by request: (arrival time, status, headers)."""

    requests: list[tuple[float, int, dict[str, str]]] = field(default_factory=list)

    def statuses(self) -> list[int]:
        return [s for _, s, _ in self.requests]


def recording(server: ChatServer) -> Seen:
    """Record every chat request's arrival and answer (a middleware added before the server starts)."""
    seen = Seen()

    @web.middleware
    async def record(request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]) -> object:
        arrived = time.monotonic()
        response = await handler(request)
        if request.path == "/v1/chat/completions":
            seen.requests.append((arrived, response.status, dict(response.headers)))
        return response

    server.app.middlewares.insert(0, record)
    return seen


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread: None) -> None:
    """Every test here runs on one torch thread (see tests/conftest.py)."""


@pytest.fixture
async def engine() -> AsyncIterator[Engine]:
    engine = make_engine(num_blocks=64, limit=2)
    await engine.start()
    yield engine
    await engine.aclose()


async def serving(engine: Engine, **config: object) -> ChatServer:
    config.setdefault("port", 0)
    config.setdefault("max_tokens", 6)
    server = ChatServer(engine, ServeConfig(**config))  # type: ignore[arg-type]
    return server
