"""Configuration: frozen, keyword-only, checked when made.

An error names the field and says how to fix it, so a bad value fails at start-up,
not in the middle of a call.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

from metronome_engine import KVPolicy

__all__ = ["AdmissionConfig", "EngineConfig", "ReliabilityConfig", "TimingConfig"]

DEFAULT_MEMORY_BYTES = 256 << 20


def _positive_int(name: str, value: object, hint: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be an int >= 1, got {value!r}; {hint}")


def _positive_float(name: str, value: object, hint: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a finite number > 0, got {value!r}; {hint}")


def _int_at_least(name: str, value: object, low: int, hint: str) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}; {hint}")


def _in_unit(name: str, value: object, hint: str, *, open_high: bool = False) -> None:
    """``value`` in ``(0, 1]`` (or ``(0, 1)`` with ``open_high``); NaN and non-numbers fail."""
    number = isinstance(value, int | float) and not isinstance(value, bool)
    if number and (0 < value < 1 or (value == 1 and not open_high)):  # type: ignore[operator]
        return
    bounds = "(0, 1)" if open_high else "(0, 1]"
    raise ValueError(f"{name} must be in {bounds}, got {value!r}; {hint}")


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineConfig:
    """The embedded engine: which model, which KV policy, how big a block pool.

    ``kv="window"`` bounds every session to its first ``sinks`` tokens plus its last
    ``window`` tokens; ``kv="full"`` keeps everything (unbounded: the baseline that
    falls off the cliff). Size the pool with ``num_blocks`` or ``memory_bytes``; with
    neither, the pool takes 256 MiB. ``kernels`` picks the engine's CPU path: ``"auto"``
    (the fused kernels where they build, else plain torch), ``"fused"`` (fail if they
    cannot build) or ``"torch"``. ``quantize`` (``"q8_0"`` or ``"q4_1"``) quantizes the
    model's weights on load, once, cached on disk (see the Models page); ``None`` keeps them.
    ``threads``: the cores a step runs on (``torch.set_num_threads``, set as the model loads;
    it is torch's setting for the whole process, so other torch models in it follow); ``None``
    leaves torch's default, one per core. On a small CPU shared with speech models, leaving
    them a core made the engine's steps faster, not slower (``metronome demo --engine-threads``).
    """

    model: str = "smollm2-135m-instruct"
    kv: Literal["window", "full"] = "window"
    window: int = 256
    sinks: int = 4
    num_blocks: int | None = None
    memory_bytes: int | None = None
    block_size: int = 16
    device: str = "cpu"
    kernels: Literal["auto", "fused", "torch"] = "auto"
    quantize: Literal["q8_0", "q4_1"] | None = None
    threads: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.model, str) or not self.model:
            raise ValueError(f"model must be a model name or folder, got {self.model!r}; try 'smollm2-135m-instruct'")
        if self.kv not in ("window", "full"):
            raise ValueError(f"kv must be 'window' or 'full', got {self.kv!r}; 'window' bounds each session")
        _positive_int("window", self.window, "try window=256")
        _int_at_least("sinks", self.sinks, 0, "4 sinks is the usual choice")
        if self.num_blocks is not None and self.memory_bytes is not None:
            raise ValueError("give num_blocks or memory_bytes to size the block pool, not both")
        if self.num_blocks is not None:
            _positive_int("num_blocks", self.num_blocks, "give the pool at least one session's bound")
        if self.memory_bytes is not None:
            _positive_int("memory_bytes", self.memory_bytes, "try memory_bytes=256 << 20")
        _positive_int("block_size", self.block_size, "16 is a good default")
        if not isinstance(self.device, str) or not self.device:
            raise ValueError(f"device must be a torch device name, got {self.device!r}; try 'cpu' or 'cuda'")
        if self.kernels not in ("auto", "fused", "torch"):
            raise ValueError(f"kernels must be 'auto', 'fused' or 'torch', got {self.kernels!r}; 'auto' is the default")
        if self.quantize not in (None, "q8_0", "q4_1"):
            raise ValueError(f"quantize must be 'q8_0', 'q4_1' or None, got {self.quantize!r}; None keeps the weights")
        if self.threads is not None:
            _positive_int("threads", self.threads, "or None for one per core")

    def kv_policy(self) -> KVPolicy:
        if self.kv == "full":
            return KVPolicy.full()
        return KVPolicy.windowed(self.window, sinks=self.sinks)

    def pool_size(self) -> dict[str, int]:
        """The keyword that sizes the engine's pool: ``num_blocks`` or ``memory_bytes``."""
        if self.num_blocks is not None:
            return {"num_blocks": self.num_blocks}
        return {"memory_bytes": self.memory_bytes if self.memory_bytes is not None else DEFAULT_MEMORY_BYTES}


@dataclass(frozen=True, slots=True, kw_only=True)
class TimingConfig:
    """The metronome: one tick every ``period`` seconds; a frame is late after ``deadline``.

    ``deadline`` defaults to the period (a frame must be answered before the next one
    is due). ``strict`` raises ``DeadlineMissed`` for a late frame instead of
    delivering it flagged. ``max_chunk_tokens`` caps the tokens one session appends
    in one tick: longer input (a system prompt, a long text turn) is split across
    ticks, and the memory guard sizes each session's bound with it.

    ``tick_tokens`` caps the tokens one tick appends over all its sessions (the per-tick
    token budget): ``"auto"`` (the default) sizes it from the step cost measured at
    engine start and on every tick since, so that a step takes at most ``step_share`` of
    the deadline (the rest is the wait for the tick); an int fixes it; ``None`` turns it
    off (every session's chunk goes whole, however long the step). Sessions already
    talking keep their beat; newcomers' prefill is spread over ticks (docs/sessions.md).

    ``growth_window`` is how many seconds of ticks the growth rate ``r`` behind ``t_sat`` is
    measured over (docs/alerting.md shows the gauge's error against it).

    ``prompt_at_open``: prefill each session's system prompt as soon as the session opens,
    within the tick budget, instead of with its first frame; the first frame then carries
    its own input (and the prompt's last token), so a turn that fits one tick is answered
    in one tick, not after the prompt's ticks too. Off by default: a session that never
    sends costs no step.
    """

    period: float = 0.080
    deadline: float | None = None
    strict: bool = False
    max_chunk_tokens: int = 64
    tick_tokens: int | Literal["auto"] | None = "auto"
    step_share: float = 0.75
    growth_window: float = 5.0
    prompt_at_open: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.prompt_at_open, bool):
            raise ValueError(f"prompt_at_open must be True or False, got {self.prompt_at_open!r}")
        _positive_float("period", self.period, "80 ms (period=0.08) is Moshi's 12.5 Hz frame rate")
        if self.deadline is not None:
            _positive_float("deadline", self.deadline, "leave it None to use the period")
        _positive_int("max_chunk_tokens", self.max_chunk_tokens, "try 64")
        if self.tick_tokens is not None and self.tick_tokens != "auto":
            _positive_int("tick_tokens", self.tick_tokens, "or 'auto' to size it from the measured step cost")
        _in_unit("step_share", self.step_share, "the share of the deadline a step may take; try 0.75")
        _positive_float("growth_window", self.growth_window, "seconds of ticks t_sat's growth rate is measured over")

    @property
    def frame_deadline(self) -> float:
        return self.period if self.deadline is None else self.deadline


@dataclass(frozen=True, slots=True, kw_only=True)
class AdmissionConfig:
    """The session cap on per-frame latency: AIMD (the default) or a model of the next tick.

    ``policy="aimd"`` moves the cap the way TCP finds a link's capacity (below).
    ``policy="model"`` predicts the tick at N+1 sessions from the measured step cost (fixed +
    per-token, refitted as the engine runs) and ``session_tokens``, and admits only what fits
    under ``target`` x deadline; every session in flight counts at its full cost, including
    ones whose first frames have not come yet. When nothing more fits it holds the cap at
    what runs (never below the sessions in flight); it stops admitting within a tick or two
    when steps run slower than their measured cost (another process took a core), and if the
    ``percentile`` misses the deadline itself at two decisions in a row it sheds the newest
    sessions with ``LoadShed``, at most ``1 - decrease`` of them per decision. AIMD stays as the feedback on
    what the model misses: a miss the model did not predict scales its cost up by
    ``1 / decrease``; each decision that meets the target scales it back toward 1.
    docs/sessions.md compares the two policies.

    AIMD:

    Every ``interval`` seconds, once ``min_samples`` frames were measured, the
    ``percentile`` of their latency is compared with ``target`` x deadline:

    - under it, and the cap was in demand: the cap grows by ``increase`` (additive);
    - above it: the cap shrinks to ``decrease`` x cap (multiplicative), at least by one.

    Defaults and why: p95 rather than p99 because a decision sees a few dozen frames,
    too few for a stable p99; a target of 0.8 leaves a fifth of the deadline as
    headroom for jitter; a cut to 0.9 (not TCP's halving) because with a bounded KV
    latency rises smoothly with load, so a small step back is enough and a halving
    would idle half the machine; one second between decisions lets a new session's
    frames show up in the latency before the next decision. The cap starts at
    ``initial_limit`` and stays within ``[min_limit, max_limit]`` and under the memory
    guard. A blocking open waits up to ``queue_timeout`` seconds for room.

    ``initial_limit=None`` (the default) starts the cap at what the engine measured at
    start: the sessions whose ``session_tokens`` a tick appends each (one decode token;
    more for audio frames or several decode tokens a tick) fit the tick's token budget.
    Without a measurement (no calibration ran, or a fixed budget with no cost model yet)
    it starts at 4.
    """

    policy: Literal["aimd", "model"] = "aimd"
    initial_limit: int | None = None
    session_tokens: int = 1
    min_limit: int = 1
    max_limit: int = 1024
    increase: int = 1
    decrease: float = 0.9
    target: float = 0.8
    percentile: float = 0.95
    interval: float = 1.0
    min_samples: int = 16
    queue_timeout: float = 1.0

    def __post_init__(self) -> None:
        if self.policy not in ("aimd", "model"):
            raise ValueError(
                f"policy must be 'aimd' or 'model', got {self.policy!r}; 'model' predicts the tick from the step cost"
            )
        _positive_int("min_limit", self.min_limit, "a cap below one session admits nobody")
        _positive_int("max_limit", self.max_limit, "try max_limit=1024")
        if self.initial_limit is not None:
            _positive_int("initial_limit", self.initial_limit, "try initial_limit=4, or None to start from measurement")
        _positive_int("session_tokens", self.session_tokens, "a talking session appends one token a tick; try 1")
        if self.min_limit > self.max_limit:
            raise ValueError(
                f"min_limit={self.min_limit} must be <= max_limit={self.max_limit}; lower min_limit or raise max_limit"
            )
        if self.initial_limit is not None and not self.min_limit <= self.initial_limit <= self.max_limit:
            raise ValueError(
                f"initial_limit={self.initial_limit} must lie in [min_limit={self.min_limit}, "
                f"max_limit={self.max_limit}]; move initial_limit inside the range"
            )
        _positive_int("increase", self.increase, "add one session per decision (increase=1)")
        _in_unit("decrease", self.decrease, "try 0.9 (TCP uses 0.5)", open_high=True)
        _in_unit("target", self.target, "it is a fraction of the deadline; try 0.8")
        _in_unit("percentile", self.percentile, "try 0.95")
        _positive_float("interval", self.interval, "try interval=1.0 (seconds between decisions)")
        _positive_int("min_samples", self.min_samples, "try min_samples=16")
        if (
            isinstance(self.queue_timeout, bool)
            or not isinstance(self.queue_timeout, int | float)
            or not math.isfinite(self.queue_timeout)
            or self.queue_timeout < 0
        ):
            raise ValueError(f"queue_timeout must be a finite number >= 0, got {self.queue_timeout!r}; try 1.0")


@dataclass(frozen=True, slots=True, kw_only=True)
class ReliabilityConfig:
    """What the engine does when a consumer, a step or the engine itself misbehaves.

    Slow consumers: a session holds at most ``output_queue`` unread outputs. When one
    more is ready, ``slow_consumer="shed"`` (the default) drops the session with
    ``LoadShed`` (its outputs so far stay readable; its blocks and its admission slot go
    to sessions that read), and ``"drop_oldest"`` discards the oldest unread output
    (counted in stats; ``OutputFrame.index`` shows the gap), for consumers that want only
    the latest. The default, 64 frames, is about 5 s of 80 ms frames.

    Fast producers: a session holds at most ``input_queue`` frames sent and not yet
    served. One more is refused by ``send()`` with ``Overloaded`` (``retry_after``: one
    tick) before anything is queued; the frames already accepted keep their place and
    get their outputs. The engine serves one frame per session per tick, so a caller
    that sends faster than the metronome ticks meets this bound instead of an ever
    longer queue (and ever later answers).

    Failed steps: a step that raises changed nothing, so it is retried at once, up to
    ``step_retries`` times; if every try fails, each session of the tick gets
    ``EngineStalled(reason="step_failed")`` with its frame handed back.

    Stuck steps: the watchdog declares a step stuck when it has run ``watchdog`` x the
    frame deadline, and at least ``watchdog_floor`` seconds; every frame waiting on it
    gets ``EngineStalled(reason="step_stuck")`` at once. Each further such period it
    stays stuck counts as one more failed tick. The floor (default 5 s) keeps a merely
    slow step from being called stuck: a real model's prefill chunk on a loaded CPU can
    take a second, and such a frame is late (admission's business), not hung.

    ``max_failed_ticks`` failed ticks in a row (failed steps or stuck periods) shut the
    engine down: every session ends with ``EngineStalled(reason="engine_failed")``.
    """

    output_queue: int = 64
    input_queue: int = 64
    slow_consumer: Literal["shed", "drop_oldest"] = "shed"
    step_retries: int = 1
    watchdog: float = 4.0
    watchdog_floor: float = 5.0
    max_failed_ticks: int = 3

    def __post_init__(self) -> None:
        _positive_int("output_queue", self.output_queue, "try output_queue=64 (about 5 s of 80 ms frames)")
        _positive_int("input_queue", self.input_queue, "try input_queue=64 (about 5 s of 80 ms frames)")
        if self.slow_consumer not in ("shed", "drop_oldest"):
            raise ValueError(
                f"slow_consumer must be 'shed' or 'drop_oldest', got {self.slow_consumer!r}; "
                "'shed' ends a session that stops reading, 'drop_oldest' keeps only its latest outputs"
            )
        _int_at_least("step_retries", self.step_retries, 0, "try step_retries=1 (0 fails a tick at its first error)")
        _positive_float("watchdog", self.watchdog, "a multiple of the frame deadline; try watchdog=4.0")
        if self.watchdog < 1:
            raise ValueError(
                f"watchdog must be >= 1 (a multiple of the frame deadline), got {self.watchdog!r}; "
                "a step is not stuck before its frame is late; try watchdog=4.0"
            )
        if (
            isinstance(self.watchdog_floor, bool)
            or not isinstance(self.watchdog_floor, int | float)
            or not (0 <= self.watchdog_floor < math.inf)
        ):
            raise ValueError(
                f"watchdog_floor must be a finite number of seconds >= 0, got {self.watchdog_floor!r}; try 5.0"
            )
        _positive_int("max_failed_ticks", self.max_failed_ticks, "try max_failed_ticks=3")
