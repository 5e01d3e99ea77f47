"""``TimingConfig.prompt_at_open``: a session's system prompt is prefilled as it opens, not with its first frame."""

from __future__ import annotations

import anyio
import pytest

from metronome_engine import KVPolicy
from metronome_sdk import CacheExhausted, EngineStalled, InputFrame, TickReport, TimingConfig
from tests.sdk.conftest import CharTokenizer, make_engine

pytestmark = pytest.mark.timeout(60)

PROMPT = "be brief and kind"


def timing(at_open: bool) -> TimingConfig:
    return TimingConfig(period=0.001, deadline=60.0, max_chunk_tokens=8, prompt_at_open=at_open)


async def _until_prefilled(tokens: int, session_stats: object) -> None:
    with anyio.fail_after(10):
        while session_stats().num_tokens < tokens:  # type: ignore[operator]
            await anyio.sleep(0.005)


async def test_the_prompt_is_prefilled_before_the_first_frame_and_the_replies_are_the_same() -> None:
    system = CharTokenizer().chat([{"role": "system", "content": PROMPT}], add_generation_prompt=False)
    replies: dict[bool, list[tuple[int, ...]]] = {}
    first_chunk: dict[bool, int] = {}
    for at_open in (False, True):
        reports: list[TickReport] = []
        engine = make_engine(KVPolicy.full(), timing=timing(at_open), on_tick=reports.append)
        async with engine, engine.session(PROMPT) as s:
            if at_open:  # all but its last token go in before any frame is sent
                await _until_prefilled(len(system) - 1, s.stats)
                assert s.stats().frames_sent == 0
            before = len(reports)
            outs = [await s.step("hi")]
            first_chunk[at_open] = sum(r.tokens for r in reports[before:])
            outs += [await s.step() for _ in range(3)]
            outs.append(await s.step("ok"))
            replies[at_open] = [o.tokens for o in outs]
            assert s.stats().num_tokens == sum(r.tokens for r in reports)  # every token appended once
    assert replies[True] == replies[False]  # the same context, token for token
    # the first frame carries its own turn and the prompt's last token, not the prompt
    assert first_chunk[False] - first_chunk[True] == len(system) - 1


async def test_an_empty_first_frame_follows_a_prompt_prefilled_at_open() -> None:
    async with make_engine(timing=timing(True)) as engine, engine.session(PROMPT) as s:
        out = await s.step()
        assert out.tokens and out.index == 0


async def test_a_session_closed_while_its_prompt_is_prefilled_leaves_no_blocks() -> None:
    engine = make_engine(KVPolicy.full(), timing=timing(True))
    async with engine:
        for _ in range(5):
            async with engine.session(PROMPT * 3):
                await anyio.sleep(0)
        with anyio.fail_after(10):
            while engine.stats().used_blocks:
                await anyio.sleep(0.005)
        assert engine.stats().sessions == 0


async def test_a_prompt_the_pool_cannot_hold_fails_the_first_frame_with_a_typed_error() -> None:
    # 24 tokens of pool under kv="full": the prompt stalls at open, and its first frame says so
    engine = make_engine(KVPolicy.full(), num_blocks=6, block_size=4, timing=timing(True))
    async with engine, engine.session("a system prompt far too long for this pool") as s:
        with anyio.fail_after(10), pytest.raises((EngineStalled, CacheExhausted)):
            await s.step(InputFrame.from_tokens([40]))
    assert engine.stats().used_blocks == 0


def test_prompt_at_open_is_a_bool() -> None:
    with pytest.raises(ValueError, match="prompt_at_open"):
        TimingConfig(prompt_at_open=1)  # type: ignore[arg-type]
