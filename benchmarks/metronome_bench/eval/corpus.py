"""Long English text that every machine has offline: the Python standard library's docstrings.

The stdlib sources are parsed with ``ast`` (never imported: ``antigravity`` opens a browser),
public modules in sorted path order, and the docstrings of each module, class and function
are taken in source order. The same Python version gives the same text, byte for byte.
"""

from __future__ import annotations

import ast
import hashlib
import platform
import sysconfig
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = ["Corpus", "iter_docstrings", "stdlib_corpus"]

# folders of tests, tools and third-party code: little prose, or not the stdlib's own
_SKIP_DIRS = frozenset(
    {"test", "tests", "idlelib", "lib2to3", "turtledemo", "ensurepip", "site-packages", "dist-packages", "pydoc_data"}
)
_MIN_DOC_CHARS = 80  # one-line docstrings ("Return x.") add little language


@dataclass(frozen=True, slots=True)
class Corpus:
    name: str  # says which text, for reports
    text: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()


def _public_sources(root: Path) -> list[Path]:
    files = []
    for path in root.rglob("*.py"):
        parts = path.relative_to(root).parts
        if any(p in _SKIP_DIRS or p.startswith((".", "config-")) for p in parts[:-1]):
            continue
        if any(p.startswith("_") for p in parts[:-1]) or (parts[-1].startswith("_") and parts[-1] != "__init__.py"):
            continue  # private modules: implementation notes rather than documentation
        files.append(path)
    return sorted(files, key=lambda p: p.relative_to(root).as_posix())


def _docstrings(tree: ast.AST) -> Iterator[str]:
    """Docstrings of ``tree`` and the classes and functions inside it, in source order."""
    if isinstance(tree, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
        doc = ast.get_docstring(tree, clean=True)
        if doc:
            yield doc
    for child in ast.iter_child_nodes(tree):
        yield from _docstrings(child)


def iter_docstrings(root: Path | None = None) -> Iterator[str]:
    """Every docstring of at least 80 characters in the stdlib at ``root`` (default: this Python's)."""
    base = Path(root) if root is not None else Path(sysconfig.get_paths()["stdlib"])
    if not base.is_dir():
        raise ValueError(f"standard library folder {base} does not exist")
    for path in _public_sources(base):
        try:
            tree = ast.parse(path.read_bytes(), filename=str(path))
        except (SyntaxError, ValueError):
            continue  # a template or a file for another Python: not text we need
        for doc in _docstrings(tree):
            if len(doc) >= _MIN_DOC_CHARS:
                yield doc


def stdlib_corpus(min_chars: int, *, root: Path | None = None) -> Corpus:
    """The first docstrings, joined by blank lines, until the text has ``min_chars`` characters."""
    if min_chars < 1:
        raise ValueError(f"min_chars must be >= 1, got {min_chars}")
    parts: list[str] = []
    size = 0
    for doc in iter_docstrings(root):
        parts.append(doc)
        size += len(doc) + 2
        if size >= min_chars:
            break
    else:
        raise ValueError(f"the standard library holds only {size} characters of docstrings; ask for fewer tokens")
    name = (
        f"docstrings of the Python {platform.python_version()} standard library "
        "(public modules in sorted path order, docstrings of 80+ characters in source order)"
    )
    return Corpus(name=name, text="\n\n".join(parts))
