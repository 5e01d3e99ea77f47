"""One writer per piece of a session's engine-side state (issue 36).

The context queued ahead of a session's frames and its last reply token (which the model must
see before the session's next chunk, and only if it was delivered) are written by the methods
of ``SessionState`` alone; everyone else calls them. An AST scan of the SDK says so.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(30)

SDK = Path(__file__).resolve().parents[3] / "src" / "metronome_sdk"
OWNED = {"feedback", "with_next_frame", "context_ahead", "rendered"}
OWNER = SDK / "_core" / "state.py"
MUTATORS = {"append", "extend", "insert", "clear", "pop"}


def _written(node: ast.AST) -> str | None:
    """The attribute a target writes: ``x.a = ...``, ``x.a[...] = ...``, ``del x.a[...]``, ``x.a += ...``."""
    while isinstance(node, ast.Subscript):
        node = node.value
    return node.attr if isinstance(node, ast.Attribute) else None


def writes(path: Path) -> set[tuple[str, int]]:
    found: set[tuple[str, int]] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign | ast.Delete):
            targets = list(node.targets)
        elif isinstance(node, ast.AugAssign | ast.AnnAssign):
            targets = [node.target]
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS:
            targets = [node.func.value]
        for target in targets:
            for t in target.elts if isinstance(target, ast.Tuple) else [target]:
                name = _written(t)
                if name in OWNED:
                    found.add((name, node.lineno))
    return found


def test_only_the_session_state_writes_its_context_and_its_last_reply_token() -> None:
    strays = {
        f"{path.relative_to(SDK)}:{line} {name}"
        for path in SDK.rglob("*.py")
        if path != OWNER
        for name, line in writes(path)
    }
    assert not strays


def test_the_scan_sees_the_writes_it_checks() -> None:
    assert {name for name, _ in writes(OWNER)} == OWNED
