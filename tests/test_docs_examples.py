"""Every ```python block in the README and docs runs, so the docs cannot drift from the code."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)


def _blocks() -> list[tuple[str, str]]:
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for i, match in enumerate(BLOCK.finditer(path.read_text(encoding="utf-8"))):
            found.append((f"{path.relative_to(ROOT)}#{i}", match.group(1)))
    return found


def test_the_docs_have_examples() -> None:
    assert len(_blocks()) >= 2


@pytest.mark.real_model
@pytest.mark.parametrize(("where", "code"), _blocks(), ids=[w for w, _ in _blocks()])
def test_doc_example_runs(where: str, code: str, capsys: pytest.CaptureFixture[str]) -> None:
    exec(compile(code, where, "exec"), {"__name__": "__doc_example__"})
    printed = capsys.readouterr().out
    # where the example says what it prints (a trailing "# ..." comment on a print), check it
    for expected in re.findall(r"print\(.*\)\s+# (.+)$", code, re.M):
        assert expected.strip() in printed, f"{where}: expected {expected!r} in output {printed!r}"
