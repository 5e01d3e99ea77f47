"""The embedded engine as the voice demo runs it on a laptop CPU."""

from __future__ import annotations

import os

from .._config import EngineConfig, TimingConfig
from .._engine import Engine

__all__ = ["demo_engine", "voice_threads"]

# No chunk cap below the default: the per-tick token budget (TimingConfig.tick_tokens="auto",
# sized from the measured step cost) already keeps a step within the deadline, and a turn that
# fits one tick's budget is answered in one tick instead of several (a cap of 16 tokens split
# every first turn, system prompt included, over three ticks: a frame at least 3 periods late).
# The default watchdog suits a shared CPU: a step is called stuck only after 5 s
# (ReliabilityConfig.watchdog_floor), and a sound step here takes well under one.
# The system prompt is prefilled as the call opens (prompt_at_open), so a caller's first turn
# carries only its own words and fits one tick like the later ones.
# A step may take 0.9 of the deadline (the default leaves a quarter for others on the engine's
# cores): the engine runs on a core of its own here (voice_threads), and at 0.75 a lone caller's
# reply frame carried three one-token steps of about 16 ms, where the fourth it asks for
# (decode_tokens) fits at 0.9; its first clause is whole a tick sooner (docs/voice-agent.md).
DEMO_TIMING = TimingConfig(period=0.08, prompt_at_open=True, step_share=0.9)


def demo_engine(*, window: int = 256, sinks: int = 4, threads: int | None = None) -> Engine:
    """SmolLM2-135M with a window KV policy, tuned for a CPU (enter it with ``async with``);
    ``threads``: ``EngineConfig.threads`` (``voice_threads()`` leaves the voice a core)."""
    return Engine(EngineConfig(kv="window", window=window, sinks=sinks, threads=threads), timing=DEMO_TIMING)


def voice_threads() -> int:
    """The engine's threads beside the voice models in one process: every core this process may
    run on but one (at least one). On 2 vCPUs the engine's second thread waited on a core the
    recognizer, the words model or the caller's audio held, and a one-token step took 13-15 ms
    instead of 6-9; on one thread the first clause came a frame sooner (docs/voice-agent.md)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores - 1)
