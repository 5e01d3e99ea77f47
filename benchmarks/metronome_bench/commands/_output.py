"""What the bench and eval commands print: tables, JSON, progress."""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

from tqdm import tqdm

__all__ = ["emit_json", "print_table", "progress_bar"]


def emit_json(result: Any) -> None:
    json.dump(result, sys.stdout, indent=2)
    sys.stdout.write("\n")


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
    cells = [[_fmt(v) for v in row] for row in rows]
    widths = [max(len(h), *(len(r[i]) for r in cells)) if cells else len(h) for i, h in enumerate(headers)]
    print("  ".join(h.rjust(w) for h, w in zip(headers, widths, strict=True)))
    print("  ".join("-" * w for w in widths))
    for r in cells:
        print("  ".join(c.rjust(w) for c, w in zip(r, widths, strict=True)))


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.4g}" if abs(v) < 1e4 else f"{v:.0f}"
    return "-" if v is None else str(v)


def progress_bar(total: int, desc: str) -> tqdm:  # type: ignore[type-arg]
    """Progress on stderr, so ``--json`` output on stdout stays clean."""
    return tqdm(total=total, desc=desc, file=sys.stderr, unit="tok", leave=False, dynamic_ncols=True)
