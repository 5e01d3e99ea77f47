"""The re-computation oracle equals a dense forward over just the W tokens before each position."""

from __future__ import annotations

import pytest
import torch

from metronome_bench.eval.oracle import recompute_nll
from tests.engine.tiny import VOCAB, tiny_hf, tiny_runner


def test_oracle_equals_a_fresh_dense_forward_over_the_window() -> None:
    hf = tiny_hf(7)
    tokens = torch.randint(0, VOCAB, (90,), generator=torch.Generator().manual_seed(3)).tolist()
    window = 12
    indices = [0, 3, 11, 12, 40, 41, 88]  # shorter prefixes than W, exactly W, and deep in the text
    got = recompute_nll(tiny_runner(hf), tokens, indices, window)
    with torch.no_grad():
        for i, nll in zip(indices, got, strict=True):
            ctx = tokens[max(0, i + 1 - window) : i + 1]
            logits = hf(torch.tensor([ctx])).logits[0, -1]
            want = -float(torch.log_softmax(logits, -1)[tokens[i + 1]])
            assert nll == pytest.approx(want, rel=1e-4, abs=1e-4)


def test_oracle_batches_do_not_change_the_result() -> None:
    model = tiny_runner(tiny_hf(8))
    tokens = torch.randint(0, VOCAB, (600,), generator=torch.Generator().manual_seed(4)).tolist()
    indices = list(range(5, 590, 7))  # W=8 puts 512 windows in one step: several steps here
    together = recompute_nll(model, tokens, indices, 8)
    alone = [recompute_nll(model, tokens, [i], 8)[0] for i in indices[:5]]
    assert together[:5] == pytest.approx(alone, rel=1e-5, abs=1e-5)


def test_oracle_rejects_positions_outside_the_text() -> None:
    model = tiny_runner(tiny_hf(8))
    with pytest.raises(ValueError, match="outside the text"):
        recompute_nll(model, [1, 2, 3], [2], 4)
    with pytest.raises(ValueError, match="window must be"):
        recompute_nll(model, [1, 2, 3], [0], 0)
