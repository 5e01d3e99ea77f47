"""The three Realtime clients of ``examples/realtime_clients.py`` each hold a turn against ``/v1/realtime``.

The official ``openai`` client, Pipecat's ``OpenAIRealtimeLLMService`` (in a real pipeline,
its own runner) and LiveKit's ``RealtimeModel``: the real classes, unpatched, pointed at a
local server by their base URL. The engine is the tiny model and the voice a fake (a tone
per clause), so what is checked is the wire: each framework gets the events it waits for, in
the order it needs, and its turn ends with 24 kHz audio and a transcript. The same program on
the real weights and voice: tests/serve/test_realtime_real.py.
"""

from __future__ import annotations

import importlib.util
import warnings
from collections.abc import Awaitable, Callable
from pathlib import Path
from types import ModuleType

import anyio
import pytest

from metronome_sdk import Engine
from tests.serve.test_realtime import realtime_server

pytestmark = pytest.mark.timeout(180)  # the first engine start in a process builds its kernels

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "realtime_clients.py"


def load_example() -> ModuleType:
    spec = importlib.util.spec_from_file_location("example_realtime_clients", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("client", ["openai", "pipecat", "livekit"])
async def test_each_client_holds_a_turn_and_leaves_nothing_behind(engine: Engine, client: str) -> None:
    pytest.importorskip({"openai": "openai", "pipecat": "pipecat", "livekit": "livekit.agents"}[client])
    ask: Callable[[str, str], Awaitable[tuple[str, float]]] = getattr(load_example(), f"ask_{client}")
    async with realtime_server(engine) as server:
        with anyio.fail_after(60), warnings.catch_warnings():
            warnings.filterwarnings("ignore", "'audioop' is deprecated", DeprecationWarning)
            text, seconds = await ask(server.url, "hello")
        assert text.strip()  # the reply's transcript (the tiny model's words)
        assert seconds >= 0.5  # ToneTTS: 0.6 s of tone for each clause
        with anyio.fail_after(10):
            while engine.stats().sessions:  # the client hung up: its session closes
                await anyio.sleep(0.02)
    assert engine.stats().used_blocks == 0
