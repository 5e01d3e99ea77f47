"""``metronome bench voice``: aiortc callers ask spoken questions of the demo; voice to voice on their clocks."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shlex
import tempfile
import time
from pathlib import Path
from typing import Any

from metronome_sdk.cli import Command

from ._output import emit_json, print_table

VOICES = ("piper-joe", "espeak-en-us")
TOKEN_ENV = "METRONOME_TOKEN"


def parse_callers(text: str) -> tuple[int, ...]:
    """``--callers``: comma-separated counts of callers at once, each in [1, 16]."""
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"--callers takes comma-separated ints, got {text!r}") from None
    if not values or any(not 1 <= v <= 16 for v in values):
        raise argparse.ArgumentTypeError(f"--callers counts must be in [1, 16], got {text!r}")
    return values


def parse_voices(text: str) -> tuple[str, ...]:
    names = tuple(n.strip() for n in text.split(",") if n.strip())
    if not names or any(n not in VOICES for n in names):
        raise argparse.ArgumentTypeError(f"--voices takes some of {','.join(VOICES)}, got {text!r}")
    return names


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an int >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected an int >= 1, got {text!r}")
    return value


def _add(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--callers", type=parse_callers, default=(1, 2, 4), help="callers at once, comma-separated (default 1,2,4)"
    )
    p.add_argument("--turns", type=_positive_int, default=3, help="questions each caller asks (default 3)")
    p.add_argument(
        "--voices",
        type=parse_voices,
        default=VOICES,
        help=f"who speaks the questions, in turn (default {','.join(VOICES)})",
    )
    p.add_argument(
        "--server",
        default=None,
        help="a running demo's URL (http://127.0.0.1:8080/); default: start `metronome demo` in its own process",
    )
    p.add_argument(
        "--demo-args", default="", help="more arguments for the `metronome demo` it starts (e.g. '--window 128')"
    )
    p.add_argument(
        "--voice-objective",
        default=None,
        metavar="SECONDS",
        help="the spawned demo's voice-to-voice objective (its admission; 'none': off); default the demo's, 1.5 s. "
        "The report says how many callers the server held within it",
    )
    p.add_argument(
        "--anchor",
        choices=("none", "pipecat"),
        default="none",
        help="also time a stock Pipecat pipeline of the same models (metronome_bench.pipecat_anchor), "
        "round for round after the demo's, with the same callers and questions (default none)",
    )
    p.add_argument("--warmup", type=int, default=1, help="questions asked first and not counted (default 1)")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds a turn may wait for its reply (default 30)")
    p.add_argument("--out", type=Path, default=Path("bench-out"), help="folder for voice.json (default bench-out/)")
    p.add_argument("--json", action="store_true", help="print JSON")
    p.epilog = f"The callers send ${TOKEN_ENV} as a bearer token when it is set."


def _speak(voices: tuple[str, ...], count: int) -> list[Any]:
    """``count`` questions, each spoken now by the next voice in ``voices``."""
    from metronome_sdk.voice import EspeakTTS, PiperTTS

    from ..eval.questions import QUESTIONS
    from ..voice import SpokenQuestion, to_caller_rate

    with contextlib.ExitStack() as stack:
        speakers: dict[str, Any] = {}
        for name in voices:
            if name == "piper-joe":
                speakers[name] = stack.enter_context(PiperTTS())
            else:
                try:
                    speakers[name] = EspeakTTS(voice=name.removeprefix("espeak-"), speed=160)
                except FileNotFoundError as exc:
                    raise ValueError(f"{exc} (or leave espeak-ng out: --voices piper-joe)") from exc
        spoken = []
        for i in range(count):
            question, voice = QUESTIONS[i % len(QUESTIONS)], voices[i % len(voices)]
            pcm, rate = speakers[voice].synthesize(question.text)
            spoken.append(SpokenQuestion(question.text, voice, to_caller_rate(pcm, rate)))
    return spoken


async def _bench(args: argparse.Namespace, questions: list[Any], log: Path) -> dict[str, Any]:
    from ..voice import machine, run_round, spawn_anchor, spawn_demo, summarize

    token = os.environ.get(TOKEN_ENV) or None
    demo_args = shlex.split(args.demo_args)
    if args.voice_objective is not None:
        demo_args += ["--voice-objective", args.voice_objective]
    async with contextlib.AsyncExitStack() as stack:
        if args.server is None:
            url = await stack.enter_async_context(spawn_demo(demo_args, log=log))
        else:
            url = args.server if args.server.endswith("/") else args.server + "/"
        anchor = None
        if args.anchor == "pipecat":
            # its log stays beside the report: Pipecat says there why a turn went unanswered
            args.out.mkdir(parents=True, exist_ok=True)
            anchor = await stack.enter_async_context(spawn_anchor(log=args.out / "anchor.log"))

        async def timed(target: str, n: int, *, rtvi: bool) -> dict[str, Any]:
            """One round of ``n`` callers on ``target``, with the load before and after it."""
            before = machine()["load_avg"]
            refused: list[dict[str, Any]] = []
            results = await run_round(
                target,
                questions,
                callers=n,
                turns=args.turns,
                token=token,
                timeout=args.timeout,
                refused=refused,
                rtvi=rtvi,
            )
            summary = summarize(n, results, refused)
            summary["load_avg"] = {"before": before, "after": machine()["load_avg"]}
            return summary

        targets = [(url, False)] + ([(anchor, True)] if anchor is not None else [])
        if args.warmup > 0:
            for target, rtvi in targets:
                await run_round(
                    target, questions[-1:], callers=1, turns=args.warmup, token=token, timeout=args.timeout, rtvi=rtvi
                )
        rounds, anchor_rounds = [], []
        for n in args.callers:  # the demo's round, then the anchor's: the same callers and questions
            rounds.append(await timed(url, n, rtvi=False))
            if anchor is not None:
                anchor_rounds.append(await timed(anchor, n, rtvi=True))
    objective = _objective(args.voice_objective)
    report: dict[str, Any] = {
        "server": args.server or "spawned: metronome demo " + shlex.join(demo_args),
        "voice_objective_s": objective,
        "held_within_objective": _held(rounds, objective),
        "rounds": rounds,
    }
    if anchor is not None:
        report["anchor"] = {
            "name": "pipecat",
            "server": "spawned: python -m metronome_bench.pipecat_anchor",
            "log": str(args.out / "anchor.log"),
            "rounds": anchor_rounds,
        }
    return report


def _objective(given: str | None) -> float | None:
    """The objective the server admits on: the one given, else the demo's default."""
    if given is None:
        return 1.5  # the demo's default (webrtc ServerConfig.voice_objective)
    if given.strip().lower() == "none":
        return None
    try:
        return float(given)
    except ValueError:
        raise ValueError(f"--voice-objective takes seconds or 'none', got {given!r}") from None


def _held(rounds: list[dict[str, Any]], objective: float | None) -> int | None:
    """The most callers at once of which every one was admitted and the p95 stayed within the objective."""
    if objective is None:
        return None
    held = (r for r in rounds if r["admitted"] == r["callers"] and r["p95"] is not None and r["p95"] <= objective)
    return max((r["callers"] for r in held), default=0)


def _run(args: argparse.Namespace) -> int:
    from metronome_sdk.cli import require

    require("aiortc", extra="webrtc", feature="metronome bench voice (its callers are aiortc peers)")
    if args.timeout <= 0:
        raise ValueError(f"--timeout must be > 0 seconds, got {args.timeout}")
    if args.warmup < 0:
        raise ValueError(f"--warmup must be >= 0, got {args.warmup}")
    _objective(args.voice_objective)  # a bad value fails before the questions are spoken
    from ..voice import machine

    started = time.monotonic()
    questions = _speak(args.voices, max(args.callers) * args.turns + 1)
    with tempfile.TemporaryDirectory(prefix="metronome-bench-voice-") as folder:
        log = Path(folder) / "demo.log"
        try:
            report = asyncio.run(_bench(args, questions, log))
        except RuntimeError as exc:
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
            raise ValueError(f"{exc}\n{tail}".rstrip()) from exc
    report["machine"] = machine()
    report["seconds"] = round(time.monotonic() - started, 1)
    args.out.mkdir(parents=True, exist_ok=True)
    saved = args.out / "voice.json"
    saved.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    if args.json:
        emit_json(report)
        return 0
    _print(report, saved)
    return 0


def _print(report: dict[str, Any], saved: Path) -> None:
    stages = sorted({s for r in report["rounds"] for s in r["server_median"]} - {"voice_to_voice"})
    print_table(
        [
            "callers",
            "admitted",
            "refused in s",
            "turns",
            "no reply",
            "ahead",
            "late frames",
            "p50 s",
            "p95 s",
            "max s",
            "server v2v s",
            *(f"{s} s" for s in stages),
        ],
        [
            [
                r["callers"],
                r["admitted"],
                r["refused_within_s"],
                r["turns"],
                r["no_reply"],
                r.get("answered_ahead", 0),
                f"{r.get('late_frames', 0)}/{r.get('frames', 0)}",
                r["p50"],
                r["p95"],
                r["max"],
                r["server_median"].get("voice_to_voice"),
                *(r["server_median"].get(s) for s in stages),
            ]
            for r in report["rounds"]
        ],
    )
    print("voice to voice on each caller's clock (p50/p95 by nearest rank); server stages: medians of its events")
    if report["voice_objective_s"] is not None:
        print(
            f"voice-to-voice objective {report['voice_objective_s']:g} s: "
            f"{report['held_within_objective']} callers at once held within it"
        )
    print()
    _print_turns(report["rounds"])
    if "anchor" in report:
        _print_anchor(report)
    m = report["machine"]
    flags = ", ".join(f"{f} {'yes' if m[f] else 'no'}" for f in ("avx2", "avx512f", "amx_tile"))
    loads = "; ".join(
        f"{r['callers']}: {r['load_avg']['before'][0]}->{r['load_avg']['after'][0]}" for r in report["rounds"]
    )
    print(f"\n{m['model_name']}, {m['cores']} cores ({flags}); load 1 min by round {loads}")
    print(f"report: {saved}  ({report['seconds']} s)")


def _print_anchor(report: dict[str, Any]) -> None:
    """Each caller count's p50 / p95 beside the anchor's, measured in the same run, and their ratio."""
    anchor = report["anchor"]
    print(f"\nagainst the anchor ({anchor['name']}: a stock Pipecat pipeline of the same models, same callers;")
    print(f"its log: {anchor['log']}):")
    rows = []
    for ours, theirs in zip(report["rounds"], anchor["rounds"], strict=True):
        ratio = [
            round(t / o, 2) if o and t else None
            for o, t in ((ours["p50"], theirs["p50"]), (ours["p95"], theirs["p95"]))
        ]
        rows.append(
            [ours["callers"], ours["p50"], ours["p95"], theirs["p50"], theirs["p95"], *ratio, theirs["no_reply"]]
        )
    print_table(
        ["callers", "metronome p50 s", "p95 s", f"{anchor['name']} p50 s", "p95 s", "p50 x", "p95 x", "no reply"], rows
    )
    _print_turns(anchor["rounds"])


def _print_turns(rounds: list[dict[str, Any]]) -> None:
    """Each turn's question, what the server heard and what it answered."""
    print_table(
        ["callers", "caller", "voice", "v2v s", "asked", "heard", "answer"],
        [
            [t["callers"], t["caller"], t["voice"], t["voice_to_voice"], t["question"], t["heard"], _cut(t["answer"])]
            for r in rounds
            for t in r["results"]
        ],
    )


def _cut(text: str, width: int = 70) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


BENCH_VOICE = Command(
    "bench",
    "voice",
    "aiortc callers ask spoken questions of `metronome demo`: end of speech to first reply audio, per caller count",
    _add,
    _run,
)
