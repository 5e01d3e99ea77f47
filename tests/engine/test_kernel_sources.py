"""The kernels' disk caches are keyed by every file their builds compile.

A build is loaded from ``$METRONOME_CACHE/kernels/<key>/`` when its key matches, so a
file that a build compiles but its key leaves out would let a stale library load after
an edit. Both builds (the engine's ``kernels`` and vLLM's ``sink_window.cpp``) include
``kernels/vector16.h``: an edit there must move both to new folders.
"""

from __future__ import annotations

import fcntl
import re
import threading
from collections.abc import Iterable
from pathlib import Path

import pytest

from metronome_engine import kernels
from metronome_engine.kernels import ISAS, KernelBuild, get_build
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


def _cpp(sources: Iterable[Path]) -> list[Path]:
    return [p for p in sources if p.suffix == ".cpp"]  # what a build compiles; the rest it includes


def test_each_build_keys_exactly_the_files_it_compiles() -> None:
    engine, vllm = get_build(), native.SinkWindowBuild()
    assert _compiled(_cpp(engine.sources)) == {p.resolve() for p in engine.sources}
    assert _compiled(_cpp(vllm.sources)) == {p.resolve() for p in vllm.sources}
    assert engine.sources == kernels.SOURCES and vllm.sources == native.SOURCES


def test_an_edited_shared_header_moves_both_builds_to_new_folders(tmp_path: Path) -> None:
    header = Path(kernels.__file__).with_name("vector16.h")
    assert header in kernels.SOURCES and header in native.SOURCES
    edited = tmp_path / header.name
    edited.write_bytes(header.read_bytes() + b"\n// edited\n")

    def with_edit(sources: tuple[Path, ...]) -> tuple[Path, ...]:
        return tuple(edited if p == header else p for p in sources)

    before = [get_build(isa).build_dir() for isa in ISAS] + [native.SinkWindowBuild().build_dir()]
    after = [KernelBuild(isa, sources=with_edit(kernels.SOURCES)).build_dir() for isa in ISAS]
    after.append(native.SinkWindowBuild(sources=with_edit(native.SOURCES)).build_dir())
    assert all(a != b and a.parent == b.parent for a, b in zip(after, before, strict=True))


def test_a_build_stopped_midway_leaves_no_lock_that_stops_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # torch's builder waits while its `lock` file exists; a build killed midway leaves one behind
    from torch.utils import cpp_extension

    seen: list[bool] = []
    monkeypatch.setattr(cpp_extension, "load", lambda **kw: seen.append((tmp_path / "lock").exists()))
    (tmp_path / "lock").touch()
    kernels.compile_and_load("stale", (), [], tmp_path)
    assert seen == [False]


@pytest.mark.timeout(30)
def test_a_build_in_progress_is_waited_for_not_broken_into(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from torch.utils import cpp_extension

    seen: list[bool] = []
    monkeypatch.setattr(cpp_extension, "load", lambda **kw: seen.append((tmp_path / "lock").exists()))
    with open(tmp_path / "build.flock", "w") as other:  # another build holds the folder, its `lock` made
        fcntl.flock(other, fcntl.LOCK_EX)
        (tmp_path / "lock").touch()
        waiting = threading.Thread(target=kernels.compile_and_load, args=("busy", (), [], tmp_path))
        waiting.start()
        waiting.join(0.5)
        assert waiting.is_alive() and seen == []  # it waits on the folder, the other's lock untouched
        assert (tmp_path / "lock").exists()
        (tmp_path / "lock").unlink()  # the other build finishes: torch removes its lock, then the flock goes
    waiting.join(10)
    assert seen == [False]
