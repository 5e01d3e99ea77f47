"""``metronome eval turns``: the wait to end a turn and the turns ended too soon, by silence and by turn models."""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path
from typing import Any

from metronome_sdk.cli import Command

from ._common import save_report
from ._output import emit_json, print_table, progress_bar
from .bench_voice import VOICES, parse_voices
from .eval_voice import open_voices


def _silences(text: str) -> tuple[float, ...]:
    try:
        values = tuple(float(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"--silences takes comma-separated seconds, got {text!r}") from None
    if not values or any(not 0.1 <= v <= 5.0 for v in values):
        raise argparse.ArgumentTypeError(f"--silences must be in [0.1, 5] seconds, got {text!r}")
    return values


MODELS = ("smart-turn", "words", "both")


def _models(text: str) -> tuple[str, ...]:
    values = tuple(x.strip() for x in text.split(",") if x.strip())
    if not values or any(v not in MODELS for v in values):
        raise argparse.ArgumentTypeError(f"--models takes some of {','.join(MODELS)}, comma-separated; got {text!r}")
    return values


def _add(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--voices", type=parse_voices, default=VOICES, help=f"who speaks, comma-separated (default {','.join(VOICES)})"
    )
    p.add_argument(
        "--silences",
        type=_silences,
        default=(0.55, 1.0),
        help="the fixed silences tried, alone and after each turn model (default 0.55,1.0 s)",
    )
    p.add_argument(
        "--models",
        type=_models,
        default=MODELS,
        help="the turn models tried at a pause, each before every silence: smart-turn (the sound), words "
        "(TextTurn on Whisper's transcript), both (both must say finished); default all three",
    )
    p.add_argument(
        "--choose-threshold",
        action="store_true",
        help="only choose the words model's threshold, on 20 sentences of its own (text, not the recordings); "
        "writes threshold.json",
    )
    p.add_argument("--pause", type=float, default=0.2, help="seconds of pause before a model is asked (default 0.2)")
    p.add_argument("--sentences", type=int, default=None, help="the first N of the ten sentences (default all)")
    p.add_argument("--out", type=Path, default=Path("bench-out"), help="folder for turns.json (default bench-out/)")
    p.add_argument("--json", action="store_true", help="print JSON")


def _choose(args: argparse.Namespace) -> int:
    from metronome_sdk.voice import TextTurn

    from ..eval.turns import choose_threshold
    from ..voice import machine

    words = TextTurn()
    report = {"model": repr(words), **choose_threshold(words.probability), "machine": machine()}
    saved = save_report(report, args.out, "threshold")
    if args.json:
        emit_json(report)
        return 0
    rows = [[f"{r['p_first']:.4f}", f"{r['p_whole']:.4f}", r["whole"]] for r in report["sentences"]]
    print_table(["p(finished) first phrase", "p(finished) whole", "sentence"], rows)
    best = report["best"]
    print(
        f"best split: any threshold in ({best['above']:.4f}, {best['below']:.4f}] "
        f"(whole read as finished minus first phrases: {best['j']:.2f}); TextTurn's default: {words.threshold}"
    )
    print(f"report: {saved}")
    return 0


def _run(args: argparse.Namespace) -> int:
    if args.choose_threshold:
        return _choose(args)
    from metronome_sdk.voice import SileroClassifier, SmartTurn, TextTurn, VoiceActivityDetector, WhisperSTT

    from ..eval.turns import PAUSED, Policy, record, run_policy, summarize
    from ..voice import machine

    if not 0.05 <= args.pause <= 1.0:
        raise ValueError(f"--pause must be in [0.05, 1] seconds, got {args.pause}")
    if args.sentences is not None and not 1 <= args.sentences <= len(PAUSED):
        raise ValueError(f"--sentences must be in [1, {len(PAUSED)}], got {args.sentences}")
    sentences = PAUSED if args.sentences is None else PAUSED[: args.sentences]
    load_before = machine()["load_avg"]
    with contextlib.ExitStack() as stack:
        voices = open_voices(stack, args.voices)
        with progress_bar(len(sentences) * len(voices), "sentences spoken") as bar:
            recordings = record(voices, sentences, on_recording=lambda: bar.update(1))
    sound = SmartTurn()
    sound.load()
    words = TextTurn()
    words.load()
    stt = WhisperSTT()

    def silero(seconds: float) -> Any:
        return lambda: VoiceActivityDetector(classifier=SileroClassifier(), end_silence=seconds)

    policies = [Policy(f"silence {s:g} s", silero(s)) for s in args.silences]
    for name in args.models:
        hears = sound if name in ("smart-turn", "both") else None
        reads = words if name in ("words", "both") else None
        policies += [
            Policy(f"{name}, else silence {s:g} s", silero(s), hears, args.pause, reads, stt if reads else None)
            for s in args.silences
        ]
    results: list[list[Any]] = [[] for _ in policies]
    with progress_bar(len(policies) * len(recordings), "recordings heard") as bar:
        for recording in recordings:  # each recording by every policy in turn: the machine's load falls on all
            for i, policy in enumerate(policies):
                results[i].append(run_policy(policy, recording))
                bar.update(1)
    summaries = [summarize(p, r) for p, r in zip(policies, results, strict=True)]
    silence_only = summaries[: len(args.silences)] * len(args.models)
    for summary, baseline in zip(summaries[len(args.silences) :], silence_only, strict=True):
        # what the model changes against the same silence alone
        summary["against"] = baseline["policy"]
        summary["wait_saved_median"] = round(baseline["whole"]["wait_median"] - summary["whole"]["wait_median"], 4)
        summary["false_end_rate_added"] = round(
            summary["paused"]["false_end_rate"] - baseline["paused"]["false_end_rate"], 4
        )
    report: dict[str, Any] = {
        "voices": list(args.voices),
        "models": {"smart-turn": repr(sound), "words": repr(words), "stt": repr(stt)},
        "sentences": [f"{a} {b}" for a, b in sentences],
        "policies": summaries,
        "machine": {**machine(), "load_avg_before": load_before},
    }
    saved = save_report(report, args.out, "turns")
    if args.json:
        emit_json(report)
        return 0
    rows = [
        [
            s["policy"],
            s["whole"]["wait_median"],
            s["whole"]["wait_mean"],
            s["whole"]["false_ends"] + s["whole"]["no_end"],
            f"{s['paused']['false_ends']}/{s['paused']['recordings']}",
            s["paused"]["wait_median"],
            s["model_seconds_median"],
        ]
        for s in report["policies"]
    ]
    print_table(
        ["policy", "wait p50 s", "wait mean s", "whole: wrong", "false ends (paused)", "paused wait p50 s", "model s"],
        rows,
    )
    for s in report["policies"]:
        if "against" in s:
            print(
                f"{s['policy']}: {s['wait_saved_median']:+.3f} s of wait saved (median), false ends "
                f"{100 * s['false_end_rate_added']:+.0f} points, against {s['against']}"
            )
    m = report["machine"]
    print(
        f"{len(recordings)} recordings: {len(sentences)} sentences by {len(voices)} voices, whole and with a "
        f"0.4-0.6 s pause mid-sentence; wait: end of speech to end of turn (the model's run time counted)"
    )
    print(f"{m['model_name']}, {m['cores']} cores; load 1 min {load_before[0]} -> {m['load_avg'][0]}")
    print(f"report: {saved}")
    return 0


EVAL_TURNS = Command(
    "eval",
    "turns",
    "the wait to end a turn and the false ends at mid-sentence pauses, by silence and by turn models",
    _add,
    _run,
)
