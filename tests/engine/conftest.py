from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from metronome_engine import kernels as fused_kernels
from metronome_engine import weights


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Converted and quantized weights go to a fresh folder; the kernels are loaded first,
    so that their build folder stays the machine's."""
    fused_kernels.available()
    root = tmp_path / "cache"
    monkeypatch.setattr(weights, "cache_dir", lambda: root)
    yield root
