"""The load test's quick variant on the tiny model (the minute on the real model is slow-marked)."""

from __future__ import annotations

import pytest

from metronome_sdk import AdmissionConfig
from tests.sdk.conftest import make_engine
from tests.serve.load import run_load


@pytest.mark.timeout(120)
async def test_four_times_the_cap_of_streams_complete_or_get_429_with_retry_after_ms() -> None:
    # a fixed cap of 3 (no AIMD growth) so that the callers beyond it meet admission
    engine = make_engine(num_blocks=64, admission=AdmissionConfig(initial_limit=3, max_limit=3, queue_timeout=0.0))
    await engine.start()
    try:
        report = await run_load(engine, seconds=5.0, max_tokens=24)
    finally:
        await engine.aclose()
    print(report)
    assert report.ok, report
    assert report.refused > 0  # the cap was met, and refused with advice
