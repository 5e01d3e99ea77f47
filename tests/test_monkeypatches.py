"""Tests inject through seams: none monkeypatches what a project module holds (issue 36).

An AST scan of tests/ for ``monkeypatch.setattr/delattr/setitem/delitem`` and ``mock.patch``
(``.object``, ``.dict``) whose target is reached from a name imported from ``metronome_sdk``,
``metronome_engine`` or ``metronome_bench`` (a module, or a class or function of one, or a
call of one such as ``get_build()``), or is a dotted string into them. A fault goes through
``FaultyBackend`` or a faulty model, a platform through ``CpuInfo``, a compiler through
``CXX``, a folder through ``METRONOME_CACHE``, a loader or worker through a parameter.
Third-party and stdlib attributes (``hmac.compare_digest``, aioice's consent interval) are
not the project's and are not listed. What must still be patched is listed below with its
reason; an entry that is no longer needed fails the test, so it goes.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(30)

TESTS = Path(__file__).resolve().parent
PROJECT = ("metronome_sdk", "metronome_engine", "metronome_bench")
PATCHERS = {"setattr", "delattr", "setitem", "delitem"}  # monkeypatch's; setenv and chdir are seams
MOCKS = {"patch", "object", "dict"}  # mock.patch, mock.patch.object, mock.patch.dict

# (file, the patched target): why no seam serves
ALLOWED: dict[tuple[str, str], str] = {}


def _project(module: str | None) -> bool:
    return module is not None and module.split(".")[0] in PROJECT


def _imported_names(tree: ast.Module) -> set[str]:
    """The names a test file binds to the project's modules, classes and functions."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names if _project(a.name)}
        elif isinstance(node, ast.ImportFrom) and _project(node.module):
            names |= {a.asname or a.name for a in node.names}
    return names


def _root(node: ast.expr) -> str | None:
    """The name an expression starts from: ``kernels`` of ``kernels._builds["native"]``."""
    while isinstance(node, ast.Attribute | ast.Subscript | ast.Call):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else None


def _is_patch(call: ast.Call) -> bool:
    func = call.func
    if not isinstance(func, ast.Attribute):
        return isinstance(func, ast.Name) and func.id == "patch"  # from unittest.mock import patch
    owner = func.value
    if func.attr in PATCHERS:
        return isinstance(owner, ast.Name) and owner.id == "monkeypatch"
    if func.attr in MOCKS:
        return func.attr == "patch" or (isinstance(owner, ast.Attribute) and owner.attr == "patch")
    return False


def patched(tree: ast.Module) -> set[str]:
    """The project targets a parsed test file patches."""
    project = _imported_names(tree)
    found: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or not _is_patch(node) or not node.args:
            continue
        target = node.args[0]
        if isinstance(target, ast.Constant) and isinstance(target.value, str):
            if _project(target.value):
                found.add(target.value)
        elif _root(target) in project:
            found.add(ast.unparse(target))
    return found


def project_patches() -> set[tuple[str, str]]:
    found: set[tuple[str, str]] = set()
    for path in TESTS.rglob("*.py"):
        for target in patched(ast.parse(path.read_text(encoding="utf-8"))):
            found.add((path.relative_to(TESTS).as_posix(), target))
    return found


def test_no_test_patches_a_project_module_without_a_written_reason() -> None:
    found = project_patches()
    assert sorted(found - set(ALLOWED)) == []
    assert sorted(set(ALLOWED) - found) == []  # an entry no test needs any more goes


def test_the_scan_sees_the_patches_it_checks() -> None:
    sample = """
import hmac
import metronome_engine.engine as engine_module
from unittest import mock
from unittest.mock import patch
from metronome_engine import kernels
from metronome_engine.kernels import get_build
from metronome_engine.vllm_backend.attention import SinkIndex


def test(monkeypatch, core):
    monkeypatch.setattr(engine_module, "sample", f)
    monkeypatch.setitem(kernels._builds, "native", b)
    monkeypatch.setattr(get_build(), "_result", e)
    monkeypatch.setattr("metronome_engine.engine.sample", f)
    mock.patch.object(SinkIndex, "build")
    patch("metronome_sdk.cli.main")
    monkeypatch.setattr(hmac, "compare_digest", c)
    monkeypatch.setattr(core, "step", s)
    monkeypatch.setenv("METRONOME_CACHE", "/tmp")
"""
    assert patched(ast.parse(sample)) == {
        "engine_module",
        "kernels._builds",
        "get_build()",
        "metronome_engine.engine.sample",
        "SinkIndex",
        "metronome_sdk.cli.main",
    }
