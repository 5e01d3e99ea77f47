"""The README quickstart, on the real SmolLM2 weights, under asyncio and under trio."""

from __future__ import annotations

import contextlib
import io
import re
from pathlib import Path

import anyio
import pytest

import metronome_sdk as metronome

pytestmark = [pytest.mark.real_model, pytest.mark.timeout(300)]

README = Path(__file__).resolve().parents[2] / "README.md"


def quickstart() -> str:
    """The README's first program, without its last line (which runs it)."""
    block = re.search(r"^```python\n(.*?)^```", README.read_text(encoding="utf-8"), re.S | re.M)
    assert block is not None
    code = block.group(1).rstrip().splitlines()
    assert code[-1].startswith("anyio.run(main)")
    return "\n".join(code[:-1])


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_readme_quickstart_runs_under_asyncio_and_trio(backend: str) -> None:
    namespace: dict[str, object] = {}
    exec(compile(quickstart(), str(README), "exec"), namespace)
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        anyio.run(namespace["main"], backend=backend)  # type: ignore[arg-type]
    assert "Paris" in out.getvalue()


async def test_a_session_alone_makes_its_engine_and_closes_it_with_itself() -> None:
    async with metronome.Session(system_prompt="You are a helpful assistant. Answer in one sentence.") as s:
        reply = await s.chat("What is the capital of France?", max_tokens=24)
        stats = s.stats()
        engine = s.engine
        assert engine is not None and not engine.closed
    assert "Paris" in reply
    assert stats.frames >= 2 and stats.stalls == 0
    assert engine.closed  # closed with its last session: nothing process-global is left behind
    assert engine.stats().sessions == 0 and engine.stats().used_blocks == 0
