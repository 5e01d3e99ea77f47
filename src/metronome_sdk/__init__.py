"""Metronome: real-time interaction-model sessions over a bounded KV cache.

``import metronome_sdk as metronome``; then ``async with metronome.Engine() as engine:`` and
``async with engine.session() as s:``.
This module only re-exports; everything lives in private modules.
"""

from metronome_engine import SamplingParams

from ._codec import FixedRateCodec, FrameCodec, TextTokenizer
from ._config import AdmissionConfig, EngineConfig, ReliabilityConfig, TimingConfig
from ._engine import Engine
from ._exceptions import (
    AdmissionRejected,
    CacheExhausted,
    DeadlineMissed,
    EngineClosed,
    EngineError,
    EngineStalled,
    InputQueueFull,
    LoadShed,
    MetronomeError,
    Overloaded,
    RewindUnavailable,
    SessionBroken,
    SessionClosed,
    SessionError,
    StallReason,
    TurnInterrupted,
)
from ._frames import InputFrame, OutputFrame
from ._metrics import EngineMetrics
from ._session import ContextMark, Interrupted, Session
from ._stats import EngineStats, SessionStats, TickReport

__all__ = [
    "AdmissionConfig",
    "AdmissionRejected",
    "CacheExhausted",
    "ContextMark",
    "DeadlineMissed",
    "Engine",
    "EngineClosed",
    "EngineConfig",
    "EngineError",
    "EngineMetrics",
    "EngineStalled",
    "EngineStats",
    "FixedRateCodec",
    "FrameCodec",
    "InputFrame",
    "InputQueueFull",
    "Interrupted",
    "LoadShed",
    "MetronomeError",
    "OutputFrame",
    "Overloaded",
    "ReliabilityConfig",
    "RewindUnavailable",
    "SamplingParams",
    "Session",
    "SessionBroken",
    "SessionClosed",
    "SessionError",
    "SessionStats",
    "StallReason",
    "TextTokenizer",
    "TickReport",
    "TimingConfig",
    "TurnInterrupted",
]
