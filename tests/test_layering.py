"""Imports point one way, and never in a circle.

- ``metronome_engine`` never imports ``metronome_sdk`` (the engine is used and tested alone).
- No two modules import each other, directly or round a longer circle: not at import time, and
  not through imports under ``TYPE_CHECKING`` or inside functions either (those run later and
  cannot fail the import, but a circle of them is still two modules that must change together).
- Benchmarks and evaluations (``metronome_bench``, their own distribution) use the SDK's and the
  engine's public modules only, and neither the SDK nor the engine imports them.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {
    "metronome_sdk": ROOT / "src" / "metronome_sdk",
    "metronome_engine": ROOT / "engine_backend" / "metronome_engine",
    "metronome_bench": ROOT / "benchmarks" / "metronome_bench",
}
# circles known and owned elsewhere: each must go, and this test fails once one does (so it is removed here)
KNOWN_CYCLES: set[tuple[str, ...]] = set()
# the same, counting imports under TYPE_CHECKING and inside functions
KNOWN_DEFERRED_CYCLES: set[tuple[str, ...]] = set()


def modules() -> dict[str, Path]:
    found = {}
    for package, folder in PACKAGES.items():
        for path in folder.rglob("*.py"):
            parts = [package, *path.relative_to(folder).with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            found[".".join(parts)] = path
    return found


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imports(name: str, path: Path, known: dict[str, Path], *, import_time_only: bool) -> set[str]:
    """The project modules ``name`` imports (at import time only, or anywhere)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()

    def add(target: str) -> None:
        # importing a.b.c runs a, a.b and a.b.c: each is an edge
        parts = target.split(".")
        for i in range(1, len(parts) + 1):
            candidate = ".".join(parts[:i])
            if candidate in known and candidate != name and not name.startswith(candidate + "."):
                found.add(candidate)

    def visit(nodes: list[ast.stmt]) -> None:
        for node in nodes:
            if isinstance(node, ast.Import):
                for alias in node.names:
                    add(alias.name)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")
                    anchor = anchor[: len(anchor) - (node.level - 1)]
                    base = ".".join([*anchor, base]) if base else ".".join(anchor)
                add(base)
                for alias in node.names:
                    if f"{base}.{alias.name}" in known:
                        add(f"{base}.{alias.name}")
            elif isinstance(node, ast.If) and _is_type_checking(node):
                if not import_time_only:
                    visit(node.body)
                visit(node.orelse)
            elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if not import_time_only:
                    visit([n for n in ast.walk(node) if isinstance(n, ast.Import | ast.ImportFrom)])
            elif isinstance(node, ast.ClassDef | ast.If | ast.Try | ast.With):
                visit([n for n in ast.iter_child_nodes(node) if isinstance(n, ast.stmt)])

    visit(tree.body)
    return found


def graph(*, import_time_only: bool) -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known, import_time_only=import_time_only) for name, path in known.items()}


def test_the_engine_never_imports_the_sdk() -> None:
    edges = graph(import_time_only=False)
    wrong = {m: sorted(t for t in targets if t.startswith("metronome_sdk")) for m, targets in edges.items()}
    assert {m: t for m, t in wrong.items() if m.startswith("metronome_engine") and t} == {}


def circles(edges: dict[str, set[str]]) -> set[tuple[str, ...]]:
    """Each circle the depth-first walk closes, from the module it re-entered."""
    found: set[tuple[str, ...]] = set()
    state: dict[str, int] = {}  # 1: on the path, 2: done
    path: list[str] = []

    def dfs(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(edges.get(node, ())):
            # a package's __init__ importing its own submodules is how packages work, not a circle
            if state.get(nxt) == 1 and not node.startswith(nxt + "."):
                found.add(tuple(path[path.index(nxt) :]))
            elif nxt not in state:
                dfs(nxt)
        path.pop()
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            dfs(node)
    return found


def test_no_module_imports_itself_round_a_circle() -> None:
    assert circles(graph(import_time_only=True)) == KNOWN_CYCLES


def test_no_circle_even_through_deferred_imports() -> None:
    assert circles(graph(import_time_only=False)) == KNOWN_DEFERRED_CYCLES


def test_a_deferred_circle_is_seen(tmp_path: Path) -> None:
    # the parser must see imports inside functions and under TYPE_CHECKING, or the check above is empty
    (tmp_path / "a.py").write_text("def f():\n    from . import b\n")
    (tmp_path / "b.py").write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from . import a\n")
    known = {"p.a": tmp_path / "a.py", "p.b": tmp_path / "b.py"}
    edges = {name: imports(name, path, known, import_time_only=False) for name, path in known.items()}
    assert circles(edges) == {("p.a", "p.b")}
    assert circles({n: imports(n, p, known, import_time_only=True) for n, p in known.items()}) == set()


def _private(module: str) -> bool:
    return any(part.startswith("_") for part in module.split("."))


def test_benchmarks_and_evaluations_use_public_modules_only() -> None:
    edges = graph(import_time_only=False)
    private = {
        (m, t)
        for m, targets in edges.items()
        if m.startswith("metronome_bench")
        for t in targets
        if t.startswith(("metronome_sdk", "metronome_engine")) and _private(t)
    }
    assert private == set()


def test_the_sdk_and_the_engine_never_import_the_benchmarks() -> None:
    edges = graph(import_time_only=False)
    wrong = {
        m: sorted(t for t in targets if t.startswith("metronome_bench"))
        for m, targets in edges.items()
        if not m.startswith("metronome_bench")
    }
    assert {m: t for m, t in wrong.items() if t} == {}


def test_the_graph_sees_the_imports_it_checks() -> None:
    # the checks above are only as good as the parser: it must find the imports that are there
    edges = graph(import_time_only=True)
    assert "metronome_sdk._core.tick" in edges["metronome_sdk._engine"]
    assert "metronome_engine" in edges["metronome_sdk._engine"]
    assert "metronome_sdk._session" in edges["metronome_sdk._engine"]  # Engine.session() makes sessions
    assert "metronome_sdk._core.link" in edges["metronome_sdk._session"]
    assert "metronome_sdk.estimators" in edges["metronome_bench.sweep"]


def test_a_module_past_about_400_lines_says_why() -> None:
    """Issue #20: no SDK module over ~400 lines without a stated reason (in its docstring)."""
    long = {}
    for name, path in modules().items():
        if not name.startswith("metronome_sdk"):
            continue
        text = path.read_text(encoding="utf-8")
        if text.count("\n") > 430:
            doc = ast.get_docstring(ast.parse(text)) or ""
            if "past 400 lines" not in doc:
                long[name] = text.count("\n")
    assert not long, f"modules past ~400 lines that do not say why (split them, or say why): {long}"


# --- issue 36 (the tick loop in _core/, one owner per session): kept apart for merging -----------


def test_a_session_reaches_its_engine_only_through_its_link() -> None:
    """``_session.py`` imports neither ``_engine.py`` nor the loop's parts, even inside a function."""
    edges = graph(import_time_only=False)["metronome_sdk._session"]
    assert "metronome_sdk._engine" not in edges
    assert {t for t in edges if t.startswith("metronome_sdk._core.")} == {
        "metronome_sdk._core.channel",
        "metronome_sdk._core.link",
    }
