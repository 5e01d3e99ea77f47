"""The embedded engine as the voice demo runs it on a laptop CPU."""

from __future__ import annotations

from .._config import EngineConfig, TimingConfig
from .._engine import Engine

__all__ = ["demo_engine"]

# A step appends at most 16 tokens, so prefilling a turn never holds the metronome for long.
# The default watchdog suits a shared CPU: a step is called stuck only after 5 s
# (ReliabilityConfig.watchdog_floor), and a sound step here takes well under one.
DEMO_TIMING = TimingConfig(period=0.08, max_chunk_tokens=16)


def demo_engine(*, window: int = 256, sinks: int = 4) -> Engine:
    """SmolLM2-135M with a window KV policy, tuned for a CPU (enter it with ``async with``)."""
    return Engine(EngineConfig(kv="window", window=window, sinks=sinks), timing=DEMO_TIMING)
