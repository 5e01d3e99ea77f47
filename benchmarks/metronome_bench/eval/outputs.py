"""What ``eval quality`` writes to its output folder: JSON, the plot, the texts, the dialog."""

from __future__ import annotations

import json
from pathlib import Path

from .plot import plot_quality
from .quality import QualityReport

__all__ = ["write_outputs"]


def _slug(policy: str, window: int | None, sinks: int) -> str:
    return "full" if window is None else f"{policy}{window}-sinks{sinks}"


def write_outputs(report: QualityReport, out: Path) -> dict[str, str]:
    """Write everything under ``out``; returns what was written, by kind."""
    out.mkdir(parents=True, exist_ok=True)
    written = {"json": str(out / "quality.json"), "plot": str(plot_quality(report, out / "quality.png"))}
    (out / "quality.json").write_text(json.dumps(report.as_json(), indent=2) + "\n")
    for g in report.generations:
        path = out / "generation" / f"{_slug(g.policy, g.window, g.sinks)}.txt"
        path.parent.mkdir(exist_ok=True)
        path.write_text(f"PROMPT: {report.gen_prompt}\n\n{g.text}\n")
        written[f"generation {_slug(g.policy, g.window, g.sinks)}"] = str(path)
    if report.dialogs:
        path = out / "dialog.md"
        path.write_text(_dialog_markdown(report))
        written["dialog"] = str(path)
    return written


def _dialog_markdown(report: QualityReport) -> str:
    runs = [d for _, d in report.dialogs]
    names = [repr(d.policy) for d in runs]
    lines = ["# Scripted dialog: answers per policy, side by side", ""]
    lines.append("| turn | expected | " + " | ".join(names) + " |")
    lines.append("|---|---|" + "---|" * len(runs))
    for k, first in enumerate(runs[0].answers):
        cells = []
        for d in runs:
            a = d.answers[k]
            mark = "ok" if a.correct else "MISS"
            cells.append(f"{a.answer.replace('|', '/').replace(chr(10), ' ')} ({mark})")
        kind = "current turn" if first.checked else "first turn (not checked)"
        lines.append(f"| {k + 1} | {first.expected} ({kind}) | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(
        "Score (current-turn facts): "
        + ", ".join(f"{n} {d.score[0]}/{d.score[1]}" for n, d in zip(names, runs, strict=True))
    )
    lines += ["", "## The user turns", ""]
    lines += [f"{k + 1}. {a.question!r}" for k, a in enumerate(runs[0].answers)]
    return "\n".join(lines) + "\n"
