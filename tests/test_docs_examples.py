"""Every code sample in the README and the docs runs, so the docs cannot drift from the code.

- A ```python block is a whole program. It runs as written, on the real SmolLM2 weights
  (``real_model``).
- A ```py block is a fragment of a program. It runs too (top-level ``await`` allowed), in the
  harness namespace below, on the tiny random Llama so that it takes milliseconds. A fragment
  that uses a name the harness lacks, or an API that changed, fails its test.

  =============  ===========================================================================
  ``metronome``  the SDK: ``import metronome_sdk as metronome``
  ``anyio``      anyio
  ``engine``     a started ``metronome.Engine`` whose admission cap is 1, taken by ``s``
  ``s``          a ``Session`` open on ``engine``, no frame sent yet
  ``frame``      a text frame: ``"Hello!"``
  ``config``     ``metronome.EngineConfig()`` (an ``Engine`` built from it loads nothing
                 until it starts)
  =============  ===========================================================================

- In both, a ``print(...)  # expected`` comment is checked: ``expected`` must be in what it printed.
- ```yaml blocks (Prometheus alert rules) parse, and every ``metronome_*`` metric the docs name exists.
- A ```python block that only includes a file (``--8<-- "examples/x.py"``, pymdownx.snippets)
  shows a whole example: ``tests/test_examples.py`` runs every file in ``examples/``.
"""

from __future__ import annotations

import ast
import inspect
import re
import types
from pathlib import Path

import anyio
import pytest
import yaml

import metronome_sdk as metronome
from tests.sdk.conftest import make_engine

ROOT = Path(__file__).resolve().parents[1]
PROGRAM = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
FRAGMENT = re.compile(r"^```py\n(.*?)^```", re.S | re.M)
INCLUDE = re.compile(r'^--8<-- "([^"]+)"\n$')
YAML = re.compile(r"^```yaml\n(.*?)^```", re.S | re.M)
# not metrics: metronome_session (a request field), metronome_x86_64_v3 (a kernel build's op namespace)
METRIC = re.compile(r"\b(metronome_(?!sdk\b|engine\b|bench\b|session\b|x86_64_v\d\b|generic\b)[a-z_]+)")


# needs vLLM, absent from the main venv: tests/vllm/test_docs_example.py runs it under `make test-vllm`
VLLM_PAGE = ROOT / "docs" / "vllm.md"


def _blocks(pattern: re.Pattern[str]) -> list[tuple[str, str]]:
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        if path == VLLM_PAGE:
            continue
        for i, match in enumerate(pattern.finditer(path.read_text(encoding="utf-8"))):
            found.append((f"{path.relative_to(ROOT)}#{i}", match.group(1)))
    return found


PROGRAMS = [(where, code) for where, code in _blocks(PROGRAM) if not INCLUDE.match(code)]
INCLUDES = [(where, code) for where, code in _blocks(PROGRAM) if INCLUDE.match(code)]
FRAGMENTS = _blocks(FRAGMENT)


def _check_printed(where: str, code: str, printed: str) -> None:
    # where a sample says what it prints (a trailing "# ..." comment on a print), check it
    for expected in re.findall(r"print\(.*\)\s+# (.+)$", code, re.M):
        assert expected.strip() in printed, f"{where}: expected {expected!r} in output {printed!r}"


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread: None) -> None:
    """Every test here runs on one torch thread (see tests/conftest.py)."""


def test_the_docs_have_runnable_examples() -> None:
    assert len(PROGRAMS) >= 3
    assert len(FRAGMENTS) >= 4


def test_the_alert_rules_parse_and_every_metric_named_exists() -> None:
    blocks = _blocks(YAML)
    assert blocks
    for where, text in blocks:
        assert isinstance(yaml.safe_load(text), dict), where
    from metronome_sdk.serve._metrics import ServeMetrics  # `metronome serve` adds its own to the engine's

    registries = [metronome.EngineMetrics().registry, ServeMetrics().registry]
    families = {m.name for r in registries for m in r.collect()}
    known = families | {f + suffix for f in families for suffix in ("_total", "_bucket", "_count", "_sum")}
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    named = {name for path in pages for name in METRIC.findall(path.read_text(encoding="utf-8"))}
    assert len(named) >= 10
    assert named <= known, f"the docs name metrics the engine does not have: {sorted(named - known)}"


@pytest.mark.parametrize(("where", "code"), INCLUDES, ids=[w for w, _ in INCLUDES])
def test_included_code_is_an_example_that_the_tests_run(where: str, code: str) -> None:
    match = INCLUDE.match(code)
    assert match is not None
    path = ROOT / match.group(1)
    assert path.parent == ROOT / "examples" and path.suffix == ".py", f"{where}: only examples/*.py are included"
    assert path.is_file(), f"{where}: {match.group(1)} does not exist"


@pytest.mark.timeout(60)
@pytest.mark.parametrize(("where", "code"), FRAGMENTS, ids=[w for w, _ in FRAGMENTS])
async def test_doc_fragment_runs(where: str, code: str, capsys: pytest.CaptureFixture[str]) -> None:
    compiled = compile(code, where, "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
    admission = metronome.AdmissionConfig(initial_limit=1, max_limit=1, queue_timeout=0.0, interval=0.1)
    engine = make_engine(admission=admission)
    await engine.start()
    session = engine.session()
    namespace: dict[str, object] = {
        "__name__": "__doc_fragment__",
        "metronome": metronome,
        "anyio": anyio,
        "engine": engine,
        "s": await session.open(),
        "frame": "Hello!",
        "config": metronome.EngineConfig(),
    }
    try:
        with anyio.fail_after(30):
            result = types.FunctionType(compiled, namespace)()
            if inspect.iscoroutine(result):  # the fragment awaits at top level
                await result
    finally:
        await session.aclose()
        await engine.aclose()
        other = namespace.get("engine")
        if isinstance(other, metronome.Engine) and other is not engine:  # the fragment made its own
            await other.aclose()
    _check_printed(where, code, capsys.readouterr().out)


@pytest.mark.real_model
@pytest.mark.parametrize(("where", "code"), PROGRAMS, ids=[w for w, _ in PROGRAMS])
def test_doc_example_runs(where: str, code: str, capsys: pytest.CaptureFixture[str]) -> None:
    exec(compile(code, where, "exec"), {"__name__": "__doc_example__"})
    _check_printed(where, code, capsys.readouterr().out)
