from __future__ import annotations

from collections.abc import Sequence

import pytest

from metronome_engine import EngineBackend, KVPolicy
from metronome_sdk import AdmissionConfig, Engine, TimingConfig
from tests.engine.tiny import VOCAB, tiny_engine
from tests.support import FaultyBackend

STOP = 1  # the stub tokenizer's end-of-turn token
_FIRST_CHAR = 3


class CharTokenizer:
    """One token per character, a tiny chat template; enough to drive text frames on the tiny model."""

    stop_ids = frozenset({STOP})

    def encode(self, text: str) -> list[int]:
        return [_FIRST_CHAR + ord(c) % (VOCAB - _FIRST_CHAR) for c in text]

    def decode(self, ids: Sequence[int]) -> str:
        return "".join(chr(ord("a") + (i - _FIRST_CHAR) % 26) for i in ids if i != STOP)

    def chat(self, messages: Sequence[dict[str, str]], *, add_generation_prompt: bool = True) -> list[int]:
        ids: list[int] = []
        for m in messages:
            ids += [2, *self.encode(m["role"][0] + m["content"]), STOP]
        return ids + ([2] if add_generation_prompt else [])


@pytest.fixture(autouse=True)
def _one_thread(one_torch_thread: None) -> None:
    """Every test here runs on one torch thread (see tests/conftest.py)."""


def make_engine(
    policy: KVPolicy | None = None,
    *,
    num_blocks: int = 64,
    block_size: int = 4,
    limit: int | None = None,
    admission: AdmissionConfig | None = None,
    timing: TimingConfig | None = None,
    faulty: bool = False,
    **kwargs: object,
) -> Engine:
    """An engine over the tiny random Llama, ticking every millisecond with a lax deadline.

    ``faulty``: serve it through a ``FaultyBackend`` (``engine.core``), to inject faults.
    """
    if admission is None:
        admission = AdmissionConfig(initial_limit=limit or 16, max_limit=limit or 64, queue_timeout=0.0)
    core: EngineBackend = tiny_engine(
        policy or KVPolicy.windowed(8, sinks=4), num_blocks=num_blocks, block_size=block_size
    )
    if faulty:
        core = FaultyBackend(core)
    timing = timing or TimingConfig(period=0.001, deadline=60.0, max_chunk_tokens=8)
    kwargs.setdefault("tokenizer", CharTokenizer())
    return Engine(core=core, timing=timing, admission=admission, **kwargs)  # type: ignore[arg-type]


class FakeClock:
    """A clock the test moves by hand."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds
