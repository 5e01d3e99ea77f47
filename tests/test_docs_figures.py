"""Every figure the benchmark pages quote agrees with the JSON it came from (docs/data/).

A figure is tied to its source in the page itself, by an HTML comment right after it (mkdocs
does not render it):

    17<!-- fig: cliff-2026-12-01.json full.collapsed -->
    2.3 %<!-- fig: forecast-2026-12-01.json full.live.leads.5.rel_err_median -->

The path walks the JSON (dots; ``[*]`` maps over a list; a last ``|max``, ``|min``, ``|sum``
or ``|len`` folds it). A figure followed by ``%`` is the value x 100. The page's figure must
equal the value rounded to the decimals the page shows. A page with figures but no marker,
or a marker whose file or path is missing, fails too.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
DATA = DOCS / "data"
PAGES = ("concepts.md", "benchmarks.md", "alerting.md", "voice-agent.md")

MARKER = re.compile(
    r"(?P<figure>-?\d[\d,]*(?:\.\d+)?)(?P<unit>\s*%|\s*ms|\s*s)?\*{0,2}<!-- fig: (?P<file>\S+) (?P<path>\S+) -->"
)
FOLDS = {"max": max, "min": min, "sum": sum, "len": len}


def walk(data: Any, path: str) -> Any:
    fold = None
    if "|" in path:
        path, fold = path.split("|", 1)
    values: list[Any] = [data]
    mapped = False
    parts = path.split(".")
    while parts:
        part = parts.pop(0)
        if part == "[*]":
            values = [v for value in values for v in value]
            mapped = True
            continue
        while isinstance(values[0], dict) and part not in values[0] and parts:
            part += "." + parts.pop(0)  # a key with a dot in it ("2.5": a growth window in seconds)
        values = [v[int(part)] if isinstance(v, list) else v[part] for v in values]
    if fold is not None:
        return FOLDS[fold](values)
    return values if mapped else values[0]


def markers(page: str) -> list[re.Match[str]]:
    return list(MARKER.finditer((DOCS / page).read_text(encoding="utf-8")))


@pytest.mark.parametrize("page", PAGES)
def test_every_marked_figure_agrees_with_its_json(page: str) -> None:
    found = markers(page)
    assert found, f"{page} marks no figure: tie its headline figures to docs/data/ with <!-- fig: FILE PATH -->"
    wrong = []
    for m in found:
        source = DATA / m["file"]
        assert source.is_file(), f"{page}: {m['file']} is not under docs/data/"
        value = walk(json.loads(source.read_text(encoding="utf-8")), m["path"])
        assert isinstance(value, int | float), f"{page}: {m['path']} in {m['file']} is {value!r}, not a number"
        text = m["figure"].replace(",", "")
        shown = float(text)
        if (m["unit"] or "").strip() == "%":
            value = value * 100
        decimals = len(text.split(".")[1]) if "." in text else 0
        if round(float(value), decimals) != shown:
            wrong.append(f"{m['figure']}{m['unit'] or ''} but {m['file']} {m['path']} = {value}")
    assert not wrong, f"{page}: figures that disagree with their JSON: {wrong}"


def test_the_json_beside_the_pages_is_small() -> None:
    for marked in {m["file"] for page in PAGES for m in markers(page)}:
        assert (DATA / marked).stat().st_size < 400_000, f"{marked}: keep the data beside the docs small"


def test_the_checker_reads_paths_and_markers() -> None:
    data = {"full": {"collapsed": 17, "per_run": [{"p": 1.5}, {"p": 3.25}]}, "err": 0.0234, "w": {"2.5": 4}}
    assert walk(data, "full.collapsed") == 17
    assert walk(data, "w.2.5") == 4
    assert walk(data, "full.per_run.[*].p|max") == 3.25
    assert walk(data, "full.per_run.[*].p|len") == 2
    page = "a **17**<!-- fig: x.json full.collapsed --> and 2.3 %<!-- fig: x.json err --> and 3.3<!-- fig: x.json y -->"
    got = [(m["figure"], (m["unit"] or "").strip(), m["path"]) for m in MARKER.finditer(page)]
    assert got == [("17", "", "full.collapsed"), ("2.3", "%", "err"), ("3.3", "", "y")]
