"""What the agent still sees: the pinned system prompt, evictions in stats, a log event and a counter."""

from __future__ import annotations

import math
from collections.abc import Sequence

import pytest
from structlog.testing import capture_logs

from metronome_engine import EngineCore, KVPolicy, ModelConfig, PoolStats, SamplingParams, StepOutput, StepRequest
from metronome_sdk import AdmissionConfig, AdmissionRejected, CacheExhausted, Engine, TimingConfig
from metronome_sdk._core.memory import ConversationMemory
from tests.engine.tiny import tiny_engine
from tests.sdk.conftest import CharTokenizer, make_engine

pytestmark = pytest.mark.timeout(60)

PROMPT = "you are zorblax, say so"  # 23 characters: 26 tokens with the stub template
WINDOW = KVPolicy.windowed(8, sinks=4)


def _counter(engine: object, name: str) -> float:
    text = engine.metrics.text().decode()  # type: ignore[attr-defined]
    return float(next(line.split()[1] for line in text.splitlines() if line.startswith(name + " ")))


@pytest.mark.parametrize("pin", [True, False])
async def test_evictions_show_in_stats_in_a_log_event_and_in_prometheus(pin: bool) -> None:
    prompt_tokens = len(CharTokenizer().chat([{"role": "system", "content": PROMPT}], add_generation_prompt=False))
    async with make_engine(KVPolicy.windowed(24, sinks=4), num_blocks=64) as engine:
        with capture_logs() as logs:
            async with engine.session(PROMPT, pin_system_prompt=pin) as s:
                first = s.stats()
                assert first.evicted_tokens == 0 and first.turns == 0 and first.oldest_resident_turn is None
                for _ in range(6):
                    await s.chat("hi", max_tokens=3)  # about 9 tokens a turn: the window holds two
                stats = s.stats()
        assert stats.turns == 6
        assert stats.pinned_tokens == (prompt_tokens if pin else 4)
        # the window keeps 24 tokens: everything between the kept prefix and it is gone
        assert stats.evicted_tokens == stats.num_tokens - 24 - stats.pinned_tokens > 0
        assert stats.system_prompt_resident is pin
        assert stats.oldest_resident_turn is not None and 2 < stats.oldest_resident_turn <= 5
        assert _counter(engine, "metronome_evicted_tokens_total") == stats.evicted_tokens
        events = [e for e in logs if e["event"] == "session.evicted"]
        assert events and all(e["session_id"] == s.id for e in events)
        assert events[-1]["oldest_resident_turn"] == stats.oldest_resident_turn
        assert sum(e["turns_lost"] for e in events) == stats.oldest_resident_turn
        assert any(not e["system_prompt_resident"] for e in events) is not pin


async def test_the_pinned_prompt_stays_resident_and_the_full_policy_evicts_nothing() -> None:
    async with make_engine(WINDOW, num_blocks=64) as engine, engine.session(PROMPT) as s:
        for _ in range(4):
            await s.chat("hello there", max_tokens=6)
        (seq_id,) = engine.core.sequence_ids()  # type: ignore[attr-defined]
        held = dict(engine.core.resident_blocks(seq_id))  # type: ignore[attr-defined]
        assert all(lb in held for lb in range(math.ceil(s.stats().pinned_tokens / 4)))
        assert s.stats().num_blocks <= engine.core.session_bound_blocks(pinned=s.stats().pinned_tokens)  # type: ignore[call-arg, operator]
    async with make_engine(KVPolicy.full(), num_blocks=64) as engine, engine.session(PROMPT) as s:
        for _ in range(3):
            await s.chat("hello there", max_tokens=6)
        stats = s.stats()
        assert (stats.evicted_tokens, stats.oldest_resident_turn, stats.pinned_tokens) == (0, 0, 0)
        assert stats.system_prompt_resident


async def test_a_prompt_too_large_for_the_pool_is_refused_at_open() -> None:
    async with make_engine(WINDOW, num_blocks=12) as engine:
        with pytest.raises(CacheExhausted) as info:
            await engine.session("x" * 40).open()
        assert info.value.needed_blocks > info.value.pool_blocks == 12
        assert engine.stats().sessions == 0
        async with engine.session("x" * 40, pin_system_prompt=False) as s:  # unpinned, it fits
            assert (await s.step("a")).tokens


async def test_the_memory_guard_counts_pinned_blocks() -> None:
    # base bound: 1 sink block + ceil((8 + 7) / 4) + 1 = 6 blocks; a 26-token pinned prompt adds 6
    async with make_engine(WINDOW, num_blocks=24, limit=16) as engine:
        assert engine.stats().memory_limit == 4
        a = await engine.session(PROMPT).open()
        b = await engine.session(PROMPT).open()  # 12 + 12 = 24 blocks: the pool is spoken for
        with pytest.raises(AdmissionRejected):
            await engine.session(PROMPT).open()
        with pytest.raises(AdmissionRejected):
            await engine.session().open()
        await b.aclose()
        c = await engine.session().open()  # 12 + 6
        d = await engine.session(PROMPT, pin_system_prompt=False).open()  # 12 + 6 + 6
        for s in (a, c, d):
            await s.aclose()


def test_memory_account_of_turns_and_prompt() -> None:
    m = ConversationMemory(KVPolicy.windowed(10, sinks=2), prompt_tokens=6, pinned=0)
    assert m.oldest_resident_turn is None and m.prompt_resident
    m.turn_started(0)  # the first frame carries the prompt: its turn starts after it
    assert m.update(9).tokens == 0 and m.oldest_resident_turn == 0
    m.turn_started(9)
    lost = m.update(16)  # 16 - 10 - 2 = 4 tokens gone, all of them the prompt's
    assert (lost.tokens, lost.turns, lost.prompt) == (4, 0, True)
    assert m.oldest_resident_turn == 0 and not m.prompt_resident
    lost = m.update(17)  # one more: the first token of turn 0
    assert (lost.tokens, lost.turns, lost.prompt, m.oldest_resident_turn) == (1, 1, False, 1)
    lost = m.update(40)  # turn 1 too: and no turn is whole
    assert (lost.tokens, lost.turns, m.oldest_resident_turn) == (23, 1, None)
    pinned = ConversationMemory(KVPolicy.windowed(10, sinks=2), prompt_tokens=6, pinned=6)
    pinned.turn_started(0)
    pinned.update(40)
    assert pinned.prompt_resident and pinned.evicted_tokens == 24 and pinned.kept_prefix == 6


class NoPinCore:
    """A backend that cannot pin a prefix (as the vLLM runner): the protocol's members only."""

    def __init__(self, core: EngineCore) -> None:
        self._core = core

    @property
    def pins_prefixes(self) -> bool:
        return False

    @property
    def policy(self) -> KVPolicy:
        return self._core.policy

    @property
    def config(self) -> ModelConfig:
        return self._core.config

    def add_sequence(self, *, sampling: SamplingParams | None = None) -> int:
        return self._core.add_sequence(sampling=sampling)

    def free_sequence(self, seq_id: int) -> None:
        self._core.free_sequence(seq_id)

    def step(self, requests: Sequence[StepRequest]) -> list[StepOutput]:
        return self._core.step(requests)

    def pool_stats(self) -> PoolStats:
        return self._core.pool_stats()

    def session_bound_blocks(self, chunk: int = 1) -> int | None:
        return self._core.session_bound_blocks(chunk)


async def test_a_backend_that_cannot_pin_lets_the_prompt_slide_and_says_so() -> None:
    core = NoPinCore(tiny_engine(KVPolicy.windowed(24, sinks=4), num_blocks=64))
    timing = TimingConfig(period=0.001, deadline=60.0, max_chunk_tokens=8)
    admission = AdmissionConfig(initial_limit=4, max_limit=4, queue_timeout=0.0)
    engine = Engine(core=core, timing=timing, admission=admission, tokenizer=CharTokenizer())  # type: ignore[arg-type]
    async with engine:
        with capture_logs() as logs:
            async with engine.session(PROMPT) as s:
                for _ in range(4):
                    await s.chat("hi", max_tokens=3)
                stats = s.stats()
        assert [e["backend"] for e in logs if e["event"] == "session.prompt_not_pinned"] == ["NoPinCore"]
        assert stats.pinned_tokens == 4 and not stats.system_prompt_resident and stats.evicted_tokens > 0
