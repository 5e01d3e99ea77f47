"""Cancel-safe turns and barge-in: no stale frame, no leaked block, whatever the interleaving.

A property test drives one session through random steps, steps cancelled after a random
number of scheduling points (so the cancellation lands at every await: before the frame is
queued, while it waits for a tick, while its step runs, after its output arrived), and
``interrupt()`` calls, alone or while a step waits. Each step that returns must return its
own frame; every block must be back in the pool at the end.
"""

from __future__ import annotations

from dataclasses import dataclass

import anyio
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from metronome_sdk import InputFrame, Interrupted, OutputFrame, ReliabilityConfig, TurnInterrupted
from tests.sdk.conftest import make_engine

pytestmark = pytest.mark.timeout(240)

TEXT = InputFrame.from_tokens([11, 12, 13])


@dataclass(frozen=True)
class Op:
    kind: str  # "step", "cancel", "interrupt", "barge_in"
    frame: bool  # an input frame (True) or an empty one (the model keeps talking)
    yields: int  # scheduling points before the cancel or the interrupt
    sleep: float  # then a little real time, so that some land while a step runs


ops = st.builds(
    Op,
    kind=st.sampled_from(["step", "step", "cancel", "interrupt", "barge_in"]),
    frame=st.booleans(),
    yields=st.integers(0, 12),
    sleep=st.sampled_from([0.0, 0.0, 0.0005, 0.002]),
)


async def _pause(op: Op) -> None:
    for _ in range(op.yields):
        await anyio.lowlevel.checkpoint()
    if op.sleep:
        await anyio.sleep(op.sleep)


async def run_ops(script: list[Op]) -> None:
    engine = make_engine(num_blocks=64, reliability=ReliabilityConfig(output_queue=8, input_queue=8))
    # tokens taken since the last input frame: what interrupt() must say it kept. More than one
    # when the script cannot tell (an interrupt racing a frame whose reply equals the one before)
    delivered: list[list[int]] = [[]]
    async with engine, engine.session() as s, engine.session() as witness:
        delivered = [list((await s.step(TEXT)).tokens)]  # a first frame with input: empty frames may follow
        for op in script:
            frame = TEXT if op.frame else None
            if op.kind == "step":
                expected = s.stats().frames_sent
                try:
                    out = await s.step(frame)
                except ValueError as exc:  # an empty frame right after a withdrawn reply: input must come
                    assert frame is None and "withdrawn" in str(exc)
                else:
                    assert out.index == expected  # its own frame: never a stale one
                    delivered = [list(out.tokens)] if op.frame else [[*d, *out.tokens] for d in delivered]
            elif op.kind == "cancel":
                sent = s.stats().frames_sent

                finished: list[OutputFrame] = []

                async def cancelled(frame: InputFrame | None = frame, finished: list[OutputFrame] = finished) -> None:
                    try:
                        finished.append(await s.step(frame))  # it may finish before the cancel lands
                    except ValueError as exc:  # an empty frame after a withdrawn reply: input must come
                        assert frame is None and "withdrawn" in str(exc)

                with anyio.CancelScope() as scope:
                    async with anyio.create_task_group() as tg:
                        tg.start_soon(cancelled)
                        await _pause(op)
                        scope.cancel()
                if op.frame and s.stats().frames_sent > sent:
                    delivered = [[]]  # its input may be in the context: the reply starts again
                for out in finished:  # returned to its caller: delivered
                    assert out.index == sent
                    delivered = [[*d, *out.tokens] for d in delivered]
            elif op.kind == "interrupt":
                got = s.interrupt()
                check_interrupt(got, *delivered)
                delivered = [[]]
            else:  # barge_in: interrupt() while a step waits
                expected = s.stats().frames_sent
                result: list[OutputFrame | BaseException] = []

                async def stepping(frame: InputFrame | None = frame, result: list[object] = result) -> None:
                    try:
                        result.append(await s.step(frame))
                    except (TurnInterrupted, ValueError) as exc:
                        result.append(exc)

                async with anyio.create_task_group() as tg:
                    tg.start_soon(stepping)
                    await _pause(op)
                    got = s.interrupt()
                [answer] = result
                if isinstance(answer, OutputFrame):  # it finished before the interrupt, or began after it
                    assert answer.index == expected
                    afters = [list(answer.tokens)] if op.frame else [[*d, *answer.tokens] for d in delivered]
                    check_interrupt(got, *delivered, *afters)
                    if list(got.kept) not in afters:  # the interrupt came first: this frame began a new reply
                        delivered = [list(answer.tokens)]
                        assert s.stats().unread_outputs == 0
                        await witness.step(TEXT)
                        continue
                    if list(got.kept) in delivered:  # either came first: the reply is this frame's, or empty
                        delivered = [[], list(answer.tokens)]
                        assert s.stats().unread_outputs == 0
                        await witness.step(TEXT)
                        continue
                elif isinstance(answer, ValueError):  # an empty frame after a withdrawn reply
                    assert frame is None and "withdrawn" in str(answer)
                else:
                    assert isinstance(answer, TurnInterrupted) and answer.index == expected
                    check_interrupt(got, *([[]] if op.frame else delivered))
                delivered = [[]]
            assert s.stats().unread_outputs == 0  # nothing left behind for a later receive()
            await witness.step(TEXT)  # the other session keeps its beat throughout
        # after all of it the session still works and answers its own frame
        expected = s.stats().frames_sent
        assert (await s.step(TEXT)).index == expected
    assert engine.core.pool_stats().used_blocks == 0  # no block leaked
    assert engine.core.pool_stats().sequences == 0


def check_interrupt(got: Interrupted, *delivered: list[int]) -> None:
    assert got.trimmed and got.untrimmed == 0  # a step-by-step caller never runs ahead of its reader
    if got.kept:  # the reply's tokens the reader took since its last input
        assert list(got.kept) in delivered


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(ops, min_size=1, max_size=12))
# an interrupt racing a frame whose reply is the same tokens as the reply before it: either order
@example([Op("barge_in", frame=True, yields=0, sleep=0.0), Op("interrupt", frame=False, yields=0, sleep=0.0)])
def test_random_steps_cancellations_and_interrupts_never_yield_a_stale_frame_or_leak_a_block(
    script: list[Op],
) -> None:
    anyio.run(run_ops, script)


async def test_interrupt_withdraws_unread_replies_and_says_which_tokens_stay() -> None:
    async with make_engine() as engine, engine.session() as s:
        first = await s.step(TEXT)
        second = await s.step()
        kept = [*first.tokens, *second.tokens]
        await s.send()  # a reply frame nobody reads before the barge-in
        await s.send()
        got = s.interrupt()
        assert got.kept == tuple(kept) and got.withdrawn == 2
        for _ in range(2):  # every frame sent gets its answer: here, that it was interrupted
            with pytest.raises(TurnInterrupted):
                await s.receive()
        assert s.stats().unread_outputs == 0  # (a frame in the running tick leaves the queue when it ends)
        out = await s.step(TEXT)  # the new input: the session goes on
        assert out.tokens and out.index == 4
        assert s.stats().unread_outputs == s.stats().queued_inputs == 0


async def test_a_sender_ahead_of_its_reader_is_told_the_context_cannot_be_trimmed() -> None:
    async with make_engine() as engine, engine.session() as s:
        await s.step(TEXT)
        for _ in range(3):  # pipelined: each reply token goes into the context with the next frame
            await s.send()
        with anyio.fail_after(10):
            while s.stats().unread_outputs < 3:
                await anyio.sleep(0.001)
        got = s.interrupt()
        assert not got.trimmed and got.untrimmed == 2  # the last one never went in: it is dropped


async def test_a_cancelled_step_before_its_tick_leaves_no_trace() -> None:
    async with make_engine() as engine, engine.session("be brief") as s:
        with anyio.CancelScope() as scope:
            scope.cancel()
            await s.step("hello")  # cancelled at its first await: nothing queued
        assert s.stats().frames_sent == 0 and s.stats().num_tokens == 0
        out = await s.step("hello")
        assert out.index == 0  # the system prompt went in with it, not with the cancelled frame
        tokens = s.stats().num_tokens
        async with make_engine() as other_engine, other_engine.session("be brief") as fresh:
            await fresh.step("hello")
            assert fresh.stats().num_tokens == tokens


async def test_an_interrupt_during_a_several_token_tick_stops_its_rounds_and_counts_those_begun() -> None:
    from metronome_engine import KVPolicy

    engine = make_engine(KVPolicy.full(), num_blocks=256, faulty=True)
    async with engine, engine.session(decode_tokens=4) as s:
        await s.step("hello")  # a prompt the tiny model answers at length (no end of turn soon)
        assert not (await s.step()).stop
        before = s.stats().num_tokens
        hold = engine.core.hold()  # the next tick's step waits: the frame is in its tick
        answers: list[object] = []

        async def stepping() -> None:
            try:
                answers.append(await s.step())
            except TurnInterrupted as exc:
                answers.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(stepping)
            await anyio.to_thread.run_sync(hold.entered.wait, 10)
            cut = s.interrupt()
            hold.release.set()
        assert isinstance(answers[0], TurnInterrupted)
        await anyio.to_thread.run_sync(hold.returned.wait, 10)
        with anyio.fail_after(10):
            while s.stats().queued_inputs:  # the withdrawn frame leaves once its tick is applied
                await anyio.sleep(0.005)
        grown = s.stats().num_tokens - before
        # delivered: only the last read token, fed back with the withdrawn frame's chunk
        assert grown == 1 + cut.untrimmed
        # the interrupt came during the tick's first step: no extra round began, nothing undelivered stays
        assert cut.trimmed and cut.untrimmed == 0


async def test_an_interrupt_between_decode_rounds_says_the_begun_round_stays_and_stops_the_rest() -> None:
    from metronome_engine import KVPolicy

    engine = make_engine(KVPolicy.full(), num_blocks=256, faulty=True)
    async with engine, engine.session(decode_tokens=4) as s:
        await s.step("hello")
        assert not (await s.step()).stop
        before = s.stats().num_tokens
        calls = engine.core.calls
        first = engine.core.hold()  # the tick's main step
        answers: list[object] = []

        async def stepping() -> None:
            try:
                answers.append(await s.step())
            except TurnInterrupted as exc:
                answers.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(stepping)
            await anyio.to_thread.run_sync(first.entered.wait, 10)
            second = engine.core.hold()  # armed while the main step hangs: it holds the first extra round
            first.release.set()
            await anyio.to_thread.run_sync(second.entered.wait, 10)
            cut = s.interrupt()  # one round begun (its token goes in), two more never begin
            second.release.set()
        assert isinstance(answers[0], TurnInterrupted)
        await anyio.to_thread.run_sync(second.returned.wait, 10)
        with anyio.fail_after(10):
            while s.stats().queued_inputs:
                await anyio.sleep(0.005)
        assert not cut.trimmed and cut.untrimmed == 1  # said, exactly: the round's appended token
        assert s.stats().num_tokens - before == 1 + cut.untrimmed  # the fed-back token and that one
        assert engine.core.calls == calls + 2  # the main step and the one round: the rest never ran
