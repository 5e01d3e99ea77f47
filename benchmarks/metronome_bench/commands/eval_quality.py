"""``metronome eval quality``: sinks vs plain window vs full context vs the oracle, on the real model."""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from metronome_sdk.cli import Command

from ._model import Loader, load_named
from ._output import emit_json, print_table, progress_bar

if TYPE_CHECKING:
    from ..eval.quality import QualityConfig, QualityReport

_PASSAGE_CHARS = (300, 600)  # a dialog turn with its passage stays under 256 tokens


def _windows(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"--windows takes comma-separated ints, got {text!r}") from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError(f"--windows must be ints >= 1, got {text!r}")
    return values


def _add(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="small counts and W=256 only: about a minute (smoke test)")
    p.add_argument("--windows", type=_windows, default=None, help="W values, comma-separated (default 128,256,512)")
    p.add_argument("--tokens", type=int, default=None, help="tokens of text to score (default 16384)")
    p.add_argument("--slices", type=int, default=None, help="slices of the stream (default 16)")
    p.add_argument("--gen-tokens", type=int, default=None, help="tokens of free-running generation (default 4000)")
    p.add_argument(
        "--oracle-positions",
        type=int,
        default=None,
        help="oracle positions per slice, every W (default 4096 / W, at most 16; a per-slice 5%% test needs hundreds)",
    )
    p.add_argument("--dialog-turns", type=int, default=None, help="dialog turns (default 12; 0 skips it)")
    p.add_argument("--seed", type=int, default=0, help="sampling seed of the generation (default 0)")
    p.add_argument("--out", type=Path, default=Path("eval-out"), help="output folder (default eval-out/)")
    p.add_argument("--model", default="smollm2-135m-instruct", help="known model name or HF Llama folder")
    p.add_argument("--json", action="store_true", help="print JSON")


def config_from_args(args: argparse.Namespace) -> QualityConfig:
    from ..eval.quality import QualityConfig

    overrides: dict[str, Any] = {"seed": args.seed}
    for name, value in (
        ("windows", args.windows),
        ("tokens", args.tokens),
        ("slices", args.slices),
        ("gen_tokens", args.gen_tokens),
        ("oracle_positions", args.oracle_positions),
        ("dialog_turns", args.dialog_turns),
    ):
        if value is not None:
            overrides[name] = value
    if args.windows is not None and (args.quick or 256 not in args.windows):
        overrides["gen_window"] = args.windows[0] if 256 not in args.windows else 256
    return QualityConfig.quick(**overrides) if args.quick else QualityConfig(**overrides)


def run(args: argparse.Namespace, load: Loader = load_named) -> int:
    """``metronome eval quality`` on parsed ``args``, on the model ``load(args.model)`` gives (by default
    the weights and tokenizer ``--model`` names; a caller's own model with its own ``load``)."""
    from ..eval.corpus import iter_docstrings, stdlib_corpus
    from ..eval.outputs import write_outputs
    from ..eval.quality import run_quality

    cfg = config_from_args(args)
    model, tokenizer = load(args.model)
    corpus = stdlib_corpus(8 * (cfg.tokens + 1))  # about 4 characters a token: twice what is needed
    stream = tokenizer.encode(corpus.text)
    if len(stream) < cfg.tokens + 1:
        raise ValueError(f"the corpus gave {len(stream)} tokens, fewer than {cfg.tokens + 1}; lower --tokens")
    lo, hi = _PASSAGE_CHARS
    fitting = (d for d in iter_docstrings() if lo <= len(d) <= hi)
    passages = list(itertools.islice(fitting, cfg.dialog_turns))
    name = f"{corpus.name}: the first {cfg.tokens + 1} tokens"
    report = run_quality(
        model,
        tokenizer,
        stream,
        text=name,
        text_sha256=corpus.sha256,
        passages=passages,
        config=cfg,
        bar=progress_bar,
    )
    written = write_outputs(report, args.out)
    if args.json:
        result = report.as_json()
        result["files"] = written
        emit_json(result)
    else:
        print_report(report)
        print()
        for kind, path in written.items():
            print(f"{kind}: {path}")
    return 0


def print_report(report: QualityReport) -> None:
    data = report.as_json()
    cfg = report.config
    trained = report.trained_context
    print(f"text: {data['text']} (sha256 {report.text_sha256[:12]})")
    print(f"scored tokens: {data['scored_tokens']} in {len(report.bounds)} slices; positions: {data['positions']}")
    full_note = f"full context: every token up to {trained}"
    if report.full.engine_policy != "KVPolicy.full()":
        full_note += f", then a {trained}-token cache ({report.full.engine_policy})"
    print(full_note)
    past = [i for i, (a, _) in enumerate(report.bounds) if a >= trained]
    rows = []
    for r in data["results"]:
        by = r["ppl_by_slice"]
        w = r["window"]
        paired = r.get("paired_ppl_by_slice")
        paired_all = None
        if r["policy"] == "window" and w is not None:
            paired_all = _ppl_of(report, report.windowed[(w, r["sinks"])], w)
        elif r["policy"] == "recompute":
            paired_all = r["ppl"]
        rows.append(
            [
                r["policy"],
                w,
                r["sinks"],
                r["ppl"] if r["policy"] != "recompute" else None,
                r.get("ppl_after_slide"),
                (sum(by[i] for i in past) / len(past)) if past and paired is not None else None,
                paired_all,
            ]
        )
    print()
    print_table(
        ["policy", "W", "sinks", "ppl", "ppl after slide", f"mean slice ppl past {trained}", "ppl on oracle positions"],
        rows,
    )
    for w in cfg.windows:
        sinks, plain, oracle = report.windowed[(w, cfg.sinks)], report.windowed[(w, 0)], report.oracle[w]
        full_s, plain_s, sinks_s = report.slice_ppl(report.full), report.slice_ppl(plain), report.slice_ppl(sinks)
        orc_p, sinks_p = report.paired_by_slice(oracle, w), report.paired_by_slice(sinks, w)
        plain_after, sinks_after = report.after_slide_by_slice(plain, w), report.after_slide_by_slice(sinks, w)
        stderr = report.paired_stderr_by_slice(sinks, w)
        print(f"\nW = {w}: per slice (* = on the oracle's {len(report.oracle_positions[w][0])} positions per slice)")
        print_table(
            [
                "slice",
                "full",
                "window",
                f"sinks={cfg.sinks}",
                "recompute*",
                "sinks*",
                "sinks*/recompute*",
                "(std. error)",
                "nosinks/sinks",
            ],
            [
                [
                    f"{a}-{b}",
                    full_s[i],
                    plain_s[i],
                    sinks_s[i],
                    orc_p[i],
                    sinks_p[i],
                    f"{sinks_p[i] / orc_p[i]:.3f}",
                    f"±{100 * stderr[i]:.1f}%",
                    _ratio(plain_after[i], sinks_after[i]),
                ]
                for i, (a, b) in enumerate(report.bounds)
            ],
        )
    print("\nchecks (the issue's thresholds are for W = 256):")
    for c in data["checks"]:
        verdict = "PASS" if c["passed"] else "FAIL"
        if c["check"].startswith("sinks"):
            print(f"  W={c['window']}: sinks within 5% of recompute on every slice: {verdict} (worst {c['worst']:.3f})")
        else:
            print(f"  W={c['window']}: no sinks >= 1.4x sinks after the slide: {verdict} (ratio {c['ratio']:.2f})")
    if data["generation"]:
        print(
            f"\nfree-running generation: {data['generation'][0]['tokens']} tokens, seed {cfg.seed}, T={cfg.temperature}"
        )
        print_table(
            ["policy", "W", "sinks", "repeated 4-grams", "distinct-2", "ppl under full", "differs from full at"],
            [
                [
                    g["policy"],
                    g["window"],
                    g["sinks"],
                    f"{g['repeated_4gram']:.3f}",
                    f"{g['distinct_2']:.3f}",
                    g["ppl_under_full"],
                    g["first_difference_from_full"],
                ]
                for g in data["generation"]
            ],
        )
    if data["dialog"]:
        print(f"\ndialog: {len(report.dialogs[0][1].answers)} turns (the last asks for the first turn's word)")
        print_table(
            ["policy", "W", "sinks", "session tokens", "current-turn facts", "first-turn recall"],
            [
                [d["policy"], d["window"], d["sinks"], d["session_tokens"], f"{d['correct']}/{d['checked']}",
                 "yes" if d["recall_first_turn_correct"] else "no"]
                for d in data["dialog"]
            ],
        )  # fmt: skip
    sys.stdout.flush()


def _ratio(a: float | None, b: float | None) -> str | None:
    return f"{a / b:.2f}" if a is not None and b is not None else None


def _ppl_of(report: QualityReport, row: Any, w: int) -> float:
    from ..eval.perplexity import perplexity

    return perplexity([row.nll[i] for p in report.oracle_positions[w] for i in p])


EVAL_QUALITY = Command(
    "eval", "quality", "sinks vs window vs full context vs the recompute oracle, on the real model", _add, run
)
