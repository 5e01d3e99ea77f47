"""The public surface: every ``__all__`` is explicit and sorted, and every public name is documented.

"Documented" means a ``::: package.Name`` entry in the generated API reference (``docs/reference/``),
which ``mkdocs build --strict`` renders from the docstrings and fails on if the name cannot be found.
"""

from __future__ import annotations

import importlib
import re
from pathlib import Path
from types import ModuleType

import pytest

import metronome_engine

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "docs" / "reference"
# the packages applications import, and the reference page that documents each
PACKAGES = {
    "metronome_sdk": "sdk.md",
    "metronome_sdk.estimators": "sdk.md",
    "metronome_sdk.voice": "voice.md",
    "metronome_sdk.transports": "voice.md",
    "metronome_sdk.webrtc": "voice.md",
    "metronome_sdk.serve": "integrations.md",
    "metronome_sdk.integrations": "integrations.md",
}


def _documented(page: str, package: str) -> set[str]:
    text = (REFERENCE / page).read_text(encoding="utf-8")
    return set(re.findall(rf"^::: {re.escape(package)}\.(\w+)$", text, re.M))


def _public(module: ModuleType) -> set[str]:
    names = {n for n in vars(module) if not n.startswith("_")} - {"annotations"}
    return {n for n in names if not isinstance(getattr(module, n), ModuleType)}


@pytest.mark.parametrize("package", PACKAGES)
def test_all_is_sorted_and_complete(package: str) -> None:
    module = importlib.import_module(package)
    names = module.__all__
    assert list(names) == sorted(names), f"{package}.__all__ is not sorted"
    assert _public(module) == set(names), f"{package}: public names and __all__ differ"


@pytest.mark.parametrize(("package", "page"), PACKAGES.items())
def test_every_public_name_is_in_the_api_reference(package: str, page: str) -> None:
    module = importlib.import_module(package)
    assert set(module.__all__) == _documented(page, package), f"{package}: __all__ and docs/reference/{page} differ"


def test_every_engine_name_is_in_the_api_reference() -> None:
    # the engine imports torch lazily, so its names are documented where they are defined
    text = (REFERENCE / "engine.md").read_text(encoding="utf-8")
    documented = set(re.findall(r"^::: metronome_engine(?:\.\w+)*\.(\w+)$", text, re.M))
    assert list(metronome_engine.__all__) == sorted(metronome_engine.__all__)
    assert set(metronome_engine.__all__) <= documented


def test_every_reference_page_is_in_the_nav() -> None:
    nav = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    for page in REFERENCE.glob("*.md"):
        assert f"reference/{page.name}" in nav, f"docs/reference/{page.name} is not in mkdocs.yml's nav"
