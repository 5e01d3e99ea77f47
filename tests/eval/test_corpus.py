from __future__ import annotations

from pathlib import Path

import pytest

from metronome_bench.eval.corpus import iter_docstrings, stdlib_corpus

LONG = "x" * 90


def test_corpus_is_deterministic_and_long_enough() -> None:
    a, b = stdlib_corpus(200_000), stdlib_corpus(200_000)
    assert a.text == b.text and a.sha256 == b.sha256
    assert len(a.text) >= 200_000
    assert "standard library" in a.name
    # the whole library holds far more than the 16,385 tokens (about 70,000 characters) the run needs
    assert sum(len(d) for d in iter_docstrings()) > 500_000


def test_builder_reads_public_sources_in_path_order_and_source_order(tmp_path: Path) -> None:
    (tmp_path / "pkg").mkdir()
    (tmp_path / "test").mkdir()
    (tmp_path / "b.py").write_text(f'"""B module {LONG}"""\ndef f():\n    """B.f {LONG}"""\n')
    a_source = f'"""A module {LONG}"""\nclass C:\n    """A.C {LONG}"""\n    def m(self):\n        """A.C.m {LONG}"""\n'
    (tmp_path / "a.py").write_text(a_source)
    (tmp_path / "pkg" / "__init__.py").write_text(f'"""pkg {LONG}"""\n')
    (tmp_path / "_private.py").write_text(f'"""private {LONG}"""\n')
    (tmp_path / "test" / "t.py").write_text(f'"""test {LONG}"""\n')
    (tmp_path / "short.py").write_text('"""too short"""\n')
    (tmp_path / "broken.py").write_text("def (:\n")
    heads = [d.split()[0] for d in iter_docstrings(tmp_path)]
    assert heads == ["A", "A.C", "A.C.m", "B", "B.f", "pkg"]
    assert stdlib_corpus(10, root=tmp_path).text.startswith("A module")


def test_asking_for_more_text_than_exists_is_a_clear_error(tmp_path: Path) -> None:
    (tmp_path / "a.py").write_text(f'"""{LONG}"""\n')
    with pytest.raises(ValueError, match="ask for fewer tokens"):
        stdlib_corpus(10_000, root=tmp_path)
    with pytest.raises(ValueError, match="does not exist"):
        list(iter_docstrings(tmp_path / "missing"))


@pytest.mark.real_model
def test_corpus_gives_the_full_run_its_tokens() -> None:
    from metronome_engine.tokenizer import Tokenizer

    tokens = Tokenizer("smollm2-135m-instruct").encode(stdlib_corpus(8 * 16385).text)
    assert len(tokens) >= 16385
