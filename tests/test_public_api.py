"""The public surface: ``__all__`` is explicit and sorted, and every public name is documented."""

from __future__ import annotations

import re
from pathlib import Path

import metronome_sdk

ROOT = Path(__file__).resolve().parents[1]


def test_all_is_sorted_and_complete() -> None:
    names = metronome_sdk.__all__
    assert list(names) == sorted(names)
    public = {n for n in vars(metronome_sdk) if not n.startswith("_")} - {"annotations"}
    modules = {n for n in public if type(getattr(metronome_sdk, n)).__name__ == "module"}
    assert public - modules == set(names)


def test_every_public_name_is_in_the_api_reference() -> None:
    page = (ROOT / "docs" / "reference" / "sdk.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"^::: metronome_sdk\.(\w+)$", page, re.M))
    assert set(metronome_sdk.__all__) == documented
