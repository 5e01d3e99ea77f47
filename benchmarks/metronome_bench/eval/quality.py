"""``eval quality``: does the bound keep quality? Sinks vs plain window vs full vs the oracle.

On one long text, every policy streams the same tokens through the engine and scores each
one (``streaming_nll``). The re-computation oracle (a fresh W-token forward per token) costs
W times as much, so it scores evenly spaced positions in every slice, and every policy is
compared with it on exactly those positions (paired), slice by slice.

Full context is the model's trained length at most: up to it the cache holds every token;
past it no cache can be full without positions the model never saw, so the full row goes on
as a cache of that length (4 sinks + the most recent tokens), which equals full context
before the limit. Positions are in-cache (StreamingLLM) under every policy.

Why this module is past 400 lines: the report (``QualityReport``: the paired tests, the
verdicts and the tables) is most of it, and it reads every field of the runs defined here.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from metronome_engine import KVPolicy, SamplingParams
from metronome_engine.model import LlamaModel

from .dialog import DialogRun, run_dialog
from .generation import ChatTokenizer, free_run
from .oracle import recompute_nll
from .perplexity import engine_for_stream, perplexity, streaming_nll
from .repetition import distinct_n, repeated_ngram_fraction
from .slicing import oracle_positions, ppl_at, slice_bounds

__all__ = [
    "GEN_PROMPT",
    "Generation",
    "QualityConfig",
    "QualityReport",
    "StreamRow",
    "full_policy",
    "run_quality",
]

GEN_PROMPT = "Tell me a long story about a lighthouse keeper, the sea, and a storm that lasts for many days."
CAP_SINKS = 4  # sinks of the full row's cache past the trained length


class ProgressBar(Protocol):
    def update(self, n: int = 1) -> None: ...

    def close(self) -> None: ...


ProgressFactory = Callable[[int, str], ProgressBar]


class _NoBar:
    def update(self, n: int = 1) -> None:
        return None

    def close(self) -> None:
        return None


def _no_bar(total: int, desc: str) -> ProgressBar:
    return _NoBar()


@dataclass(frozen=True, slots=True, kw_only=True)
class QualityConfig:
    tokens: int = 16384  # scored tokens of the text (the stream is one longer)
    windows: tuple[int, ...] = (128, 256, 512)
    sinks: int = 4
    slices: int = 16
    oracle_budget: int = 4096  # oracle forward tokens per slice and W ...
    oracle_max_per_slice: int = 16  # ... and at most this many positions: W=128, 256 score 16 a slice, W=512 8
    oracle_positions: int | None = None  # positions per slice for every W, overriding the two above
    gen_tokens: int = 4000
    gen_window: int = 256
    dialog_turns: int = 12
    seed: int = 0
    temperature: float = 0.8
    top_p: float = 0.95
    chunk: int = 128  # tokens per engine step when streaming (does not change the result)

    def __post_init__(self) -> None:
        if not self.windows or any(isinstance(w, bool) or not isinstance(w, int) or w < 1 for w in self.windows):
            raise ValueError(f"windows must be ints >= 1, got {self.windows!r}; try 128,256,512")
        if self.tokens < 2 * self.slices:
            raise ValueError(
                f"tokens={self.tokens} is too few for {self.slices} slices; give at least {2 * self.slices}"
            )
        if self.slices < 1:
            raise ValueError(f"slices must be >= 1, got {self.slices}")
        if self.sinks < 1:
            raise ValueError(f"sinks must be >= 1 (the sinks row is compared with no sinks), got {self.sinks}")
        if self.gen_tokens < 0 or self.dialog_turns < 0:
            raise ValueError("gen_tokens and dialog_turns must be >= 0 (0 skips that part)")
        if self.gen_window < 1:
            raise ValueError(f"gen_window must be >= 1, got {self.gen_window}")
        if self.oracle_budget < 1 or self.oracle_max_per_slice < 1 or self.chunk < 1:
            raise ValueError("oracle_budget, oracle_max_per_slice and chunk must be >= 1")
        if self.oracle_positions is not None and self.oracle_positions < 1:
            raise ValueError(f"oracle_positions must be >= 1 (None: the budget rule), got {self.oracle_positions}")

    @classmethod
    def quick(cls, **overrides: Any) -> QualityConfig:
        """Small counts and one W: about a minute on two cores, for smoke tests."""
        base = cls(tokens=2048, windows=(256,), slices=4, oracle_budget=4096, gen_tokens=192, dialog_turns=3)
        return replace(base, **overrides)

    def positions_per_slice(self, window: int, slice_tokens: int) -> int:
        """Oracle positions per slice: ``oracle_positions`` if given, else ``oracle_budget / W`` within
        [4, oracle_max_per_slice]; at most the slice."""
        if self.oracle_positions is not None:
            return min(slice_tokens, self.oracle_positions)
        return min(slice_tokens, max(4, min(self.oracle_max_per_slice, self.oracle_budget // window)))


@dataclass(slots=True)
class StreamRow:
    """One policy's scores: every token when streamed; sampled positions for the oracle."""

    policy: str  # "full" | "window" | "recompute"
    window: int | None
    sinks: int
    nll: list[float]  # per scored token (streamed) or per oracle position (recompute)
    engine_policy: str  # what the engine ran, e.g. KVPolicy.windowed(256, sinks=4)
    seconds: float = 0.0


@dataclass(slots=True)
class Generation:
    policy: str
    window: int | None
    sinks: int
    tokens: list[int]
    text: str
    ppl_under_full: float
    first_difference: int | None  # first token that differs from the full-context text

    @property
    def repeated_4gram(self) -> float:
        return repeated_ngram_fraction(self.tokens, 4)

    @property
    def distinct_2(self) -> float:
        return distinct_n(self.tokens, 2)


@dataclass(slots=True)
class QualityReport:
    config: QualityConfig
    text: str
    text_sha256: str
    stream: list[int]
    trained_context: int
    bounds: list[tuple[int, int]]
    full: StreamRow
    windowed: dict[tuple[int, int], StreamRow] = field(default_factory=dict)  # (W, sinks) -> row
    oracle: dict[int, StreamRow] = field(default_factory=dict)
    oracle_positions: dict[int, list[list[int]]] = field(default_factory=dict)
    generations: list[Generation] = field(default_factory=list)
    dialogs: list[tuple[str, DialogRun]] = field(default_factory=list)  # (policy name, run)
    gen_prompt: str = GEN_PROMPT

    # figures -------------------------------------------------------------------------------

    def slice_ppl(self, row: StreamRow) -> list[float]:
        return [perplexity(row.nll[a:b]) for a, b in self.bounds]

    def paired_by_slice(self, row: StreamRow, window: int) -> list[float]:
        """Perplexity per slice on W's oracle positions (the oracle row is already on them)."""
        if row.policy == "recompute":
            per = len(self.oracle_positions[window][0])
            return [perplexity(row.nll[i * per : (i + 1) * per]) for i in range(len(self.bounds))]
        return [ppl_at(row.nll, pos) for pos in self.oracle_positions[window]]

    def paired_stderr_by_slice(self, row: StreamRow, window: int) -> list[float]:
        """Standard error of log(row / oracle) per slice, from the paired per-position differences:
        how far a slice's ratio can sit from the truth by the choice of positions alone."""
        oracle = self.oracle[window].nll
        out = []
        k = 0
        for pos in self.oracle_positions[window]:
            diffs = [row.nll[i] - oracle[k + j] for j, i in enumerate(pos)]
            k += len(pos)
            out.append(statistics.stdev(diffs) / math.sqrt(len(diffs)) if len(diffs) > 1 else math.inf)
        return out

    def after_slide(self, row: StreamRow, window: int) -> float:
        """Perplexity of the tokens after W's window first slid (sinks + W tokens in)."""
        return perplexity(row.nll[window + self.config.sinks : self.bounds[-1][1]])

    def after_slide_by_slice(self, row: StreamRow, window: int) -> list[float | None]:
        start = window + self.config.sinks
        return [perplexity(row.nll[max(a, start) : b]) if b > start else None for a, b in self.bounds]

    def checks(self) -> list[dict[str, Any]]:
        """The issue's relations, for every W run (the issue's thresholds are set for W = 256)."""
        out: list[dict[str, Any]] = []
        s = self.config.sinks
        for w in self.config.windows:
            sinks, plain, oracle = self.windowed[(w, s)], self.windowed[(w, 0)], self.oracle[w]
            ratios = [
                a / b for a, b in zip(self.paired_by_slice(sinks, w), self.paired_by_slice(oracle, w), strict=True)
            ]
            out.append(
                {
                    "check": "sinks_within_5pct_of_recompute",
                    "window": w,
                    "sinks": s,
                    "ratio_by_slice": ratios,
                    "log_ratio_stderr_by_slice": self.paired_stderr_by_slice(sinks, w),
                    "worst": max(ratios, key=lambda r: abs(r - 1.0)),
                    "passed": all(abs(r - 1.0) <= 0.05 for r in ratios),
                }
            )
            by_slice = [
                (a / b if a is not None and b is not None else None)
                for a, b in zip(self.after_slide_by_slice(plain, w), self.after_slide_by_slice(sinks, w), strict=True)
            ]
            overall = self.after_slide(plain, w) / self.after_slide(sinks, w)
            out.append(
                {
                    "check": "no_sinks_at_least_1.4x_sinks_after_slide",
                    "window": w,
                    "ratio": overall,
                    "ratio_by_slice": by_slice,
                    "passed": overall >= 1.4,
                }
            )
        return out

    def as_json(self) -> dict[str, Any]:
        cfg = self.config
        results: list[dict[str, Any]] = []
        full = self.full
        results.append(
            {
                "policy": "full",
                "window": None,
                "sinks": 0,
                "ppl": perplexity(full.nll[: self.bounds[-1][1]]),
                "ppl_by_slice": self.slice_ppl(full),
                "context_limit": self.trained_context,
                "engine_policy": full.engine_policy,
                "paired_ppl_by_slice": {str(w): self.paired_by_slice(full, w) for w in cfg.windows},
                "seconds": full.seconds,
            }
        )
        for w in cfg.windows:
            for s in (0, cfg.sinks):
                row = self.windowed[(w, s)]
                results.append(
                    {
                        "policy": "window",
                        "window": w,
                        "sinks": s,
                        "ppl": perplexity(row.nll[: self.bounds[-1][1]]),
                        "ppl_by_slice": self.slice_ppl(row),
                        "ppl_after_slide": self.after_slide(row, w),
                        "paired_ppl_by_slice": self.paired_by_slice(row, w),
                        "engine_policy": row.engine_policy,
                        "seconds": row.seconds,
                    }
                )
            orc = self.oracle[w]
            results.append(
                {
                    "policy": "recompute",
                    "window": w,
                    "sinks": 0,
                    "ppl": perplexity(orc.nll),
                    "ppl_by_slice": self.paired_by_slice(orc, w),
                    "positions_per_slice": len(self.oracle_positions[w][0]),
                    "scored_positions": len(orc.nll),
                    "sampled": True,
                    "seconds": orc.seconds,
                }
            )
        return {
            "text": self.text,
            "text_sha256": self.text_sha256,
            "tokens": len(self.stream),
            "scored_tokens": self.bounds[-1][1],
            "trained_context": self.trained_context,
            "positions": "in-cache (StreamingLLM): resident tokens at 0..S+W-1",
            "slices": [list(b) for b in self.bounds],
            "oracle_positions": {str(w): [i for s in p for i in s] for w, p in self.oracle_positions.items()},
            "results": results,
            "checks": self.checks(),
            "generation": [
                {
                    "policy": g.policy,
                    "window": g.window,
                    "sinks": g.sinks,
                    "tokens": len(g.tokens),
                    "repeated_4gram": g.repeated_4gram,
                    "distinct_2": g.distinct_2,
                    "ppl_under_full": g.ppl_under_full,
                    "first_difference_from_full": g.first_difference,
                    "prompt": self.gen_prompt,
                    "seed": cfg.seed,
                    "temperature": cfg.temperature,
                    "top_p": cfg.top_p,
                }
                for g in self.generations
            ],
            "dialog": [
                {
                    "policy": name,
                    "window": None if name == "full" else d.policy.window,
                    "sinks": 0 if name == "full" else d.policy.sinks,
                    "engine_policy": repr(d.policy),
                    "correct": d.score[0],
                    "checked": d.score[1],
                    "session_tokens": d.tokens,
                    "answers": [a.answer for a in d.answers],
                    "expected": [a.expected for a in d.answers],
                    "recall_first_turn_correct": d.answers[-1].correct,
                }
                for name, d in self.dialogs
            ],
        }


def full_policy(n_tokens: int, trained_context: int) -> KVPolicy:
    """Every token, up to the trained length; past it, a cache of that length (sinks + recent)."""
    if n_tokens <= trained_context:
        return KVPolicy.full()
    return KVPolicy.windowed(trained_context - CAP_SINKS, sinks=CAP_SINKS)


def _stream(
    model: LlamaModel, policy: KVPolicy, tokens: Sequence[int], chunk: int, bar: ProgressFactory, label: str
) -> tuple[list[float], float]:
    import time

    engine = engine_for_stream(model, policy, len(tokens), chunk=chunk)
    b = bar(len(tokens) - 1, label)
    t0 = time.perf_counter()
    try:
        result = streaming_nll(engine, tokens, chunk=chunk, progress=b.update)
    finally:
        b.close()
    return result.nll, time.perf_counter() - t0


def run_quality(
    model: LlamaModel,
    tokenizer: ChatTokenizer,
    stream: Sequence[int],
    *,
    text: str,
    text_sha256: str,
    passages: Sequence[str] = (),
    config: QualityConfig | None = None,
    bar: ProgressFactory = _no_bar,
) -> QualityReport:
    """Score ``stream`` under every policy, then generate and converse under W = ``gen_window``."""
    import time

    cfg = config or QualityConfig()
    if len(stream) < cfg.tokens + 1:
        raise ValueError(f"the text has {len(stream)} tokens; {cfg.tokens + 1} are needed to score {cfg.tokens}")
    stream = list(stream[: cfg.tokens + 1])
    trained = model.config.max_position_embeddings
    bounds = slice_bounds(cfg.tokens, cfg.slices)
    fp = full_policy(len(stream), trained)
    nll, secs = _stream(model, fp, stream, cfg.chunk, bar, "full context")
    report = QualityReport(
        config=cfg,
        text=text,
        text_sha256=text_sha256,
        stream=stream,
        trained_context=trained,
        bounds=bounds,
        full=StreamRow("full", None, 0, nll, repr(fp), secs),
    )
    for w in cfg.windows:
        for s in (0, cfg.sinks):
            policy = KVPolicy.windowed(w, sinks=s)
            nll, secs = _stream(model, policy, stream, cfg.chunk, bar, f"window {w} sinks {s}")
            report.windowed[(w, s)] = StreamRow("window", w, s, nll, repr(policy), secs)
    for w in cfg.windows:
        positions = oracle_positions(bounds, cfg.positions_per_slice(w, bounds[0][1] - bounds[0][0]))
        flat = [i for p in positions for i in p]
        b = bar(len(flat), f"recompute oracle W={w}")
        t0 = time.perf_counter()
        try:
            nll = recompute_nll(model, stream, flat, w, progress=b.update)
        finally:
            b.close()
        report.oracle_positions[w] = positions
        report.oracle[w] = StreamRow("recompute", w, 0, nll, "fresh forward per position", time.perf_counter() - t0)
    gen_policies = [
        ("full", None, 0, full_policy(cfg.gen_tokens + 512, trained)),
        ("window", cfg.gen_window, 0, KVPolicy.windowed(cfg.gen_window, sinks=0)),
        ("window", cfg.gen_window, cfg.sinks, KVPolicy.windowed(cfg.gen_window, sinks=cfg.sinks)),
    ]
    if cfg.gen_tokens:
        report.generations = _generate(model, tokenizer, gen_policies, cfg, bar)
    if cfg.dialog_turns:
        if len(passages) < cfg.dialog_turns:
            raise ValueError(f"the dialog needs {cfg.dialog_turns} passages, got {len(passages)}")
        b = bar(len(gen_policies) * (cfg.dialog_turns + 1), "dialog")
        try:
            report.dialogs = [
                (name, run_dialog(model, tokenizer, p, passages[: cfg.dialog_turns], progress=b.update))
                for name, _, _, p in gen_policies
            ]
        finally:
            b.close()
    return report


def _generate(
    model: LlamaModel,
    tokenizer: ChatTokenizer,
    policies: Sequence[tuple[str, int | None, int, KVPolicy]],
    cfg: QualityConfig,
    bar: ProgressFactory,
) -> list[Generation]:
    prompt = tokenizer.chat([{"role": "user", "content": GEN_PROMPT}])
    sampling = SamplingParams(temperature=cfg.temperature, top_p=cfg.top_p, seed=cfg.seed)
    trained = model.config.max_position_embeddings
    gens: list[Generation] = []
    for name, w, s, policy in policies:
        b = bar(cfg.gen_tokens, f"generate {policy!r}")
        try:
            out = free_run(
                model, policy, prompt, cfg.gen_tokens, sampling=sampling, banned=tokenizer.stop_ids, progress=b.update
            )
        finally:
            b.close()
        # the judge: the full-context model reading prompt + output
        whole = prompt + out
        judge = engine_for_stream(model, full_policy(len(whole), trained), len(whole), chunk=cfg.chunk)
        nll = streaming_nll(judge, whole, chunk=cfg.chunk).nll[len(prompt) - 1 :]
        first = None
        if gens:
            ref = gens[0].tokens
            first = next((i for i, (a, c) in enumerate(zip(ref, out, strict=True)) if a != c), None)
        gens.append(Generation(name, w, s, out, tokenizer.decode(out), perplexity(nll), first))
    return gens
