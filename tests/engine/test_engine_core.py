"""EngineCore: bad input is refused whole, a full pool is a reported stall, blocks come back."""

from __future__ import annotations

import pytest
import torch

from metronome_engine import EngineCore, KVPolicy, SamplingParams, Stall, StepRequest
from metronome_engine.engine import Kernels
from metronome_engine.weights import load_model

from .tiny import VOCAB, faulty_engine, tiny_engine, tiny_hf, tiny_runner


def test_pool_smaller_than_one_sessions_bound_is_refused() -> None:
    with pytest.raises(ValueError, match=r"cannot hold one session's bound of 4 blocks.*num_blocks"):
        tiny_engine(KVPolicy.windowed(8, sinks=4), num_blocks=3, block_size=4)
    tiny_engine(KVPolicy.windowed(8, sinks=4), num_blocks=4, block_size=4)  # exactly the bound is fine


def test_pool_needs_exactly_one_size() -> None:
    model = tiny_runner(tiny_hf())
    with pytest.raises(ValueError, match="exactly one of num_blocks or memory_bytes"):
        EngineCore(model, policy=KVPolicy.full())
    with pytest.raises(ValueError, match="exactly one"):
        EngineCore(model, policy=KVPolicy.full(), num_blocks=4, memory_bytes=1 << 20)


def test_unknown_model_names_the_fix() -> None:
    with pytest.raises(ValueError, match=r"model='no-such-model'.*known model"):
        load_model("no-such-model")


@pytest.mark.parametrize("bad", [[VOCAB], [-1], [3, 2**40], [1.5], [True]])
def test_token_ids_outside_the_vocabulary_are_refused_before_anything_changes(bad: list[object]) -> None:
    engine = tiny_engine(KVPolicy.full())
    a, b = engine.add_sequence(), engine.add_sequence()
    engine.step([StepRequest(a, [1, 2, 3])])
    used = engine.pool_stats().used_blocks
    with pytest.raises(ValueError, match="outside the vocabulary"):
        engine.step([StepRequest(a, [4]), StepRequest(b, bad)])  # type: ignore[arg-type]
    assert engine.sequence_length(a) == 3 and engine.sequence_length(b) == 0
    assert engine.pool_stats().used_blocks == used


def test_empty_duplicate_and_unknown_requests_are_refused() -> None:
    engine = tiny_engine(KVPolicy.full())
    a = engine.add_sequence()
    with pytest.raises(ValueError, match="empty"):
        engine.step([StepRequest(a, [])])
    with pytest.raises(ValueError, match="twice"):
        engine.step([StepRequest(a, [1]), StepRequest(a, [2])])
    with pytest.raises(ValueError, match="not an open sequence"):
        engine.step([StepRequest(999, [1])])


def test_full_pool_is_a_stall_value_and_other_sessions_proceed() -> None:
    engine = tiny_engine(KVPolicy.full(), num_blocks=6, block_size=4)
    hog, other = engine.add_sequence(), engine.add_sequence()
    engine.step([StepRequest(other, [1, 2, 3])])  # other holds 1 block with room for one more token
    engine.step([StepRequest(hog, list(range(20)))])  # hog takes the other 5 blocks
    assert engine.pool_stats().used_blocks == 6
    outs = engine.step([StepRequest(hog, [5]), StepRequest(other, [4])])
    assert outs[0].stall is Stall.POOL_EXHAUSTED and outs[0].token is None and not outs[0].ok
    assert outs[0].num_tokens == 20  # nothing appended: the caller may retry, nothing is lost
    assert outs[1].ok and outs[1].token is not None and outs[1].num_tokens == 4
    engine.free_sequence(hog)
    retry = engine.step([StepRequest(other, [outs[1].token])])[0]
    assert retry.ok and retry.num_tokens == 5


def test_closing_sessions_returns_every_block() -> None:
    engine = tiny_engine(KVPolicy.windowed(6, sinks=2), num_blocks=64, block_size=4)
    seqs = [engine.add_sequence() for _ in range(5)]
    for i in range(30):
        engine.step([StepRequest(s, [(i + s) % VOCAB]) for s in seqs])
    assert engine.pool_stats().used_blocks > 0 and engine.sequence_ids() == seqs
    for s in seqs:
        engine.free_sequence(s)
        engine.free_sequence(s)  # idempotent
    assert engine.pool_stats().used_blocks == 0 and engine.pool_stats().sequences == 0
    assert engine.sequence_ids() == []


def test_a_failed_step_gives_back_its_reservations(kernels: Kernels) -> None:
    engine, model = faulty_engine(KVPolicy.full(), num_blocks=16, block_size=4, kernels=kernels)
    a = engine.add_sequence()
    engine.step([StepRequest(a, [1, 2, 3, 4])])
    before = engine.pool_stats().used_blocks
    model.error = RuntimeError("injected")  # the step has reserved its blocks and written its K/V
    with pytest.raises(RuntimeError, match="injected"):
        engine.step([StepRequest(a, [5, 6, 7, 8, 9])])
    assert engine.pool_stats().used_blocks == before and engine.sequence_length(a) == 4


def test_sampling_is_seeded_and_varies_by_seed() -> None:
    def run(seed: int) -> list[int]:
        engine = tiny_engine(KVPolicy.full())
        s = engine.add_sequence(sampling=SamplingParams(temperature=1.0, top_p=0.9, seed=seed))
        toks, nxt = [], [1, 2, 3]
        for _ in range(20):
            out = engine.step([StepRequest(s, nxt)])[0]
            assert out.token is not None
            toks.append(out.token)
            nxt = [out.token]
        return toks

    assert run(1) == run(1)
    assert run(1) != run(2)


@pytest.mark.parametrize(
    ("kwargs", "field"), [({"temperature": -1.0}, "temperature"), ({"top_p": 0.0}, "top_p"), ({"top_k": -3}, "top_k")]
)
def test_bad_sampling_params_name_the_field(kwargs: dict[str, float], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        SamplingParams(**kwargs)  # type: ignore[arg-type]


def test_a_windowed_session_runs_past_the_trained_positions(kernels: Kernels) -> None:
    # the tiny model is trained for 256 positions; a windowed session never rotates past S+W
    engine = tiny_engine(KVPolicy.windowed(8, sinks=2), num_blocks=16, block_size=4, kernels=kernels)
    s = engine.add_sequence()
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        out = engine.step([StepRequest(s, torch.randint(0, VOCAB, (40,), generator=gen).tolist(), return_logits=True)])[
            0
        ]
        assert out.ok and out.logits is not None and torch.isfinite(out.logits).all()
    assert engine.sequence_length(s) == 800 and engine.sequence_blocks(s) <= 5  # at rest: the decode bound
