"""Code in the README and docs: ```python blocks are whole programs and run; ```py blocks
are fragments of a program and must at least compile (top-level ``await`` allowed)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PROGRAM = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
FRAGMENT = re.compile(r"^```py\n(.*?)^```", re.S | re.M)


def _blocks(pattern: re.Pattern[str]) -> list[tuple[str, str]]:
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for i, match in enumerate(pattern.finditer(path.read_text(encoding="utf-8"))):
            found.append((f"{path.relative_to(ROOT)}#{i}", match.group(1)))
    return found


def test_the_docs_have_runnable_examples() -> None:
    assert len(_blocks(PROGRAM)) >= 3


@pytest.mark.parametrize(("where", "code"), _blocks(FRAGMENT), ids=[w for w, _ in _blocks(FRAGMENT)])
def test_doc_fragment_compiles(where: str, code: str) -> None:
    compile(code, where, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)


@pytest.mark.real_model
@pytest.mark.parametrize(("where", "code"), _blocks(PROGRAM), ids=[w for w, _ in _blocks(PROGRAM)])
def test_doc_example_runs(where: str, code: str, capsys: pytest.CaptureFixture[str]) -> None:
    exec(compile(code, where, "exec"), {"__name__": "__doc_example__"})
    printed = capsys.readouterr().out
    # where the example says what it prints (a trailing "# ..." comment on a print), check it
    for expected in re.findall(r"print\(.*\)\s+# (.+)$", code, re.M):
        assert expected.strip() in printed, f"{where}: expected {expected!r} in output {printed!r}"
