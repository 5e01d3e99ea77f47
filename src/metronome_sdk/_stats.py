"""Snapshots an engine and its sessions report: plain frozen values."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["EngineStats", "SessionStats", "TickReport"]


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineStats:
    """The engine at one moment.

    Latencies are seconds over the most recent frames (``None`` before the first).
    ``growth_rate`` is ``r``, KV blocks per second per session, measured over the last
    ``TimingConfig.growth_window`` seconds; ``t_sat`` is the seconds until the pool is full
    at that growth, free blocks ``/ (sessions * growth_rate)`` (``None``: it will not fill).
    """

    sessions: int
    limit: int
    memory_limit: int | None
    admitted: int
    rejected: int
    pool_blocks: int
    used_blocks: int
    occupancy: float
    ticks: int
    frames: int
    latency_p50: float | None
    latency_p95: float | None
    latency_p99: float | None
    deadline: float
    deadline_misses: int
    stalls: int
    growth_rate: float
    t_sat: float | None
    # faults (see docs/reliability.md)
    step_failures: int = 0  # step attempts that raised, retried ones included
    failed_ticks: int = 0  # ticks whose step failed on every try, or watchdog periods a step was stuck
    stuck_steps: int = 0  # steps the watchdog declared stuck
    broken: int = 0  # sessions dropped for non-finite logits (SessionBroken)
    shed: int = 0  # sessions shed with LoadShed (outputs left unread, or a machine too slow for them)
    outputs_dropped: int = 0  # unread outputs discarded (slow_consumer="drop_oldest")
    failed: bool = False  # the engine shut down after max_failed_ticks failed ticks in a row
    # the per-tick token budget (docs/sessions.md)
    tick_tokens: int | None = None  # the budget now: most tokens one tick appends (None: no budget)
    budget_waits: int = 0  # session-ticks a frame waited because the tick's budget was spent
    slow_steps: int = 0  # steps past the watchdog's limit but within their tokens' measured cost (load shed)
    # what set ``limit`` at the last tick under the model policy ("model", "budget", "burst", "running",
    # "memory", ...: docs/sessions.md); None under AIMD, whose cap is its own feedback
    limit_bound_by: str | None = None


@dataclass(frozen=True, slots=True, kw_only=True)
class SessionStats:
    """One session at one moment: its counts, its queues' depths, and what its model still sees.

    ``pinned_tokens`` are the first tokens that never leave the cache (the sinks, or the
    pinned system prompt); ``evicted_tokens`` the conversation tokens the window has
    dropped since (0 under the full policy). Turns count from 0, one per frame that
    carries input; ``oldest_resident_turn`` is the oldest still wholly in the cache
    (``None`` before the first turn, or when not even the latest fits in the window).
    """

    session_id: int
    open: bool
    frames: int
    deadline_misses: int
    stalls: int
    num_tokens: int
    num_blocks: int
    outputs_dropped: int = 0
    frames_sent: int = 0  # input frames accepted
    queued_inputs: int = 0  # input frames waiting for a tick (bounded by ReliabilityConfig.input_queue)
    unread_outputs: int = 0  # outputs and errors waiting for the reader (bounded by output_queue)
    pinned_tokens: int = 0
    evicted_tokens: int = 0
    turns: int = 0
    oldest_resident_turn: int | None = None
    system_prompt_resident: bool = True


@dataclass(frozen=True, slots=True, kw_only=True)
class TickReport:
    """What one tick did: handed to ``Engine(on_tick=...)`` after every tick (for benchmarks)."""

    tick: int
    time: float  # clock time the output was ready
    sessions: int
    served: int  # sessions whose tokens the step appended
    stalled: tuple[int, ...]  # ids of sessions the pool could not serve
    latencies: tuple[float, ...]  # per-frame latency of every frame answered this tick
    step_seconds: float
    used_blocks: int
    pool_blocks: int
    tokens: int = 0  # tokens the tick appended (extra decode rounds included)
    waiting: tuple[int, ...] = ()  # ids of sessions with input that waited on the tick's token budget
    tick_tokens: int | None = None  # the tick's token budget (None: no budget)
    grown_blocks: int = 0  # blocks the tick's sessions took (what the growth rate is measured from)
    growth_rate: float = 0.0  # stats().growth_rate after this tick
    t_sat: float | None = None  # stats().t_sat after this tick: the gauge, as published
