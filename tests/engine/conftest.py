from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from metronome_engine import kernels as fused_kernels
from metronome_engine import paths

# the builds whose ops the op-by-op tests run: every build this machine runs, or, in a run held
# to one build (tests/run_each_build.py sets METRONOME_KERNELS_ISA), that build alone
BUILDS = (fused_kernels.default_isa(),) if os.environ.get(fused_kernels.ISA_ENV) else fused_kernels.runnable_isas()


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Converted and quantized weights go to a fresh folder (``METRONOME_CACHE``); the
    kernels are loaded first, so that their build folder stays the machine's."""
    fused_kernels.available()
    root = tmp_path / "cache"
    monkeypatch.setenv("METRONOME_CACHE", str(root))
    assert paths.cache_dir() == root
    yield root
