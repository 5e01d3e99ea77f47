"""The kernels' disk caches are keyed by every file their builds compile.

A build is loaded from ``$METRONOME_CACHE/kernels/<key>/`` when its key matches, so a
file that a build compiles but its key leaves out would let a stale library load after
an edit. Both builds (the engine's ``kernels`` and vLLM's ``sink_window.cpp``) include
``kernels/vector16.h``: an edit there must move both to new folders.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path

import pytest

from metronome_engine import kernels
from metronome_engine.kernels import ISAS, get_build
from metronome_engine.vllm_backend import native

_QUOTED_INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)


def _compiled(sources: Iterable[Path]) -> set[Path]:
    """The sources and every file they include by a quoted name (beside the includer), transitively."""
    todo, seen = list(sources), set[Path]()
    while todo:
        path = todo.pop().resolve()
        if path not in seen:
            seen.add(path)
            todo += [path.parent / name for name in _QUOTED_INCLUDE.findall(path.read_text())]
    return seen


def test_each_build_keys_exactly_the_files_it_compiles() -> None:
    engine_sources = [p for p in kernels._SOURCES if p.suffix == ".cpp"]
    assert _compiled(engine_sources) == {p.resolve() for p in kernels._SOURCES}
    assert _compiled([native._SOURCE]) == {p.resolve() for p in native._KEYED}


def test_an_edited_shared_header_moves_both_builds_to_new_folders(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    header = Path(kernels.__file__).with_name("vector16.h")
    assert header in kernels._SOURCES and header in native._KEYED
    before = [get_build(isa).build_dir() for isa in ISAS] + [native._build_dir()]
    edited = tmp_path / header.name
    edited.write_bytes(header.read_bytes() + b"\n// edited\n")
    monkeypatch.setattr(kernels, "_SOURCES", [edited if p == header else p for p in kernels._SOURCES])
    monkeypatch.setattr(native, "_KEYED", tuple(edited if p == header else p for p in native._KEYED))
    after = [get_build(isa).build_dir() for isa in ISAS] + [native._build_dir()]
    assert all(a != b and a.parent == b.parent for a, b in zip(after, before, strict=True))
