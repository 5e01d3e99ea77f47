"""The embedded engine as the voice demo runs it on a laptop CPU."""

from __future__ import annotations

from .._config import EngineConfig, ReliabilityConfig, TimingConfig
from .._engine import Engine

__all__ = ["demo_engine"]

# A step appends at most 16 tokens, so prefilling a turn never holds the metronome for long;
# a step is stuck after 4.8 s (60 x the 80 ms deadline), not after the 320 ms default: on a
# CPU shared with a browser and a speech recognizer a sound step can take half a second.
DEMO_TIMING = TimingConfig(period=0.08, max_chunk_tokens=16)
DEMO_RELIABILITY = ReliabilityConfig(watchdog=60.0)


def demo_engine(*, window: int = 256, sinks: int = 4) -> Engine:
    """SmolLM2-135M with a window KV policy, tuned for a CPU (enter it with ``async with``)."""
    return Engine(
        EngineConfig(kv="window", window=window, sinks=sinks), timing=DEMO_TIMING, reliability=DEMO_RELIABILITY
    )
