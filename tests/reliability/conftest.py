from __future__ import annotations

import pytest
import torch

from metronome_engine import EngineCore


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread: None) -> None:
    """Every test here runs on one torch thread (see tests/conftest.py)."""


def poison(core: EngineCore, seq_id: int) -> None:
    """Corrupt one session's state: NaN in every K/V slot it holds (a bit flip, a bad kernel)."""
    bs = core.pool.block_size
    slots = torch.tensor([pb * bs + j for _, pb in core.resident_blocks(seq_id) for j in range(bs)])
    core.cache.k.index_fill_(2, slots, float("nan"))
    core.view.invalidate()  # the next step re-reads the rows from the pool
