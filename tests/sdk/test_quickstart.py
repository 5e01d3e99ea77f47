"""The README quickstart, on the real SmolLM2 weights and the default embedded engine."""

from __future__ import annotations

import pytest

import metronome_sdk as metronome

pytestmark = [pytest.mark.real_model, pytest.mark.timeout(300)]


async def test_readme_quickstart() -> None:
    async with metronome.Session(system_prompt="You are a helpful assistant. Answer in one sentence.") as s:
        reply = await s.chat("What is the capital of France?", max_tokens=24)
        stats = s.stats()
    assert "Paris" in reply
    assert stats.frames >= 2 and stats.stalls == 0
    engine = metronome.default_engine()
    assert engine.stats().sessions == 0
    assert engine.stats().used_blocks == 0  # closing the session returned its blocks
    await engine.aclose()
