"""The per-tick token budget planner, without a model: caps, fairness, nothing lost."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from metronome_sdk._core.budget import Demand, Grant, plan_tick

pytestmark = pytest.mark.timeout(120)


def spent(plan: dict[int, Grant], step_cost: int) -> int:
    """Budget a plan uses: its tokens plus the fixed cost of each extra decode round."""
    return sum(g.tokens for g in plan.values()) + step_cost * max((g.rounds for g in plan.values()), default=0)


def test_talking_sessions_keep_their_beat_and_a_newcomer_gets_the_rest() -> None:
    demands = [Demand(1, 1, talking=True), Demand(2, 1, talking=True), Demand(3, 200)]
    plan = plan_tick(demands, budget=10, max_chunk=64)
    assert plan[1] == Grant(1, 1) and plan[2] == Grant(1, 1)
    assert plan[3] == Grant(8, 0)  # the prompt is spread over ticks: no output yet


def test_no_budget_takes_every_chunk_whole() -> None:
    plan = plan_tick([Demand(1, 100), Demand(2, 3, decode=4)], budget=None, max_chunk=64)
    assert plan == {1: Grant(64, 0), 2: Grant(3, 4)}


def test_the_longest_waiting_session_goes_first_with_a_fair_share() -> None:
    demands = [Demand(1, 5, talking=True), Demand(2, 5, talking=True), Demand(3, 50, waited=3)]
    plan = plan_tick(demands, budget=6, max_chunk=64)
    assert plan[3].chunk == 2  # its share of 6 among three
    assert plan[1] == Grant(4, 0) and plan[2] == Grant(0, 0)


def test_extra_decode_rounds_are_charged_their_step_cost() -> None:
    demands = [Demand(1, 1, decode=4, talking=True), Demand(2, 1, decode=2, talking=True)]
    assert plan_tick(demands, budget=2, max_chunk=8, step_cost=5) == {1: Grant(1, 1), 2: Grant(1, 1)}
    plan = plan_tick(demands, budget=2 + 5 + 2, max_chunk=8, step_cost=5)
    assert plan == {1: Grant(1, 2), 2: Grant(1, 2)}
    plan = plan_tick(demands, budget=100, max_chunk=8, step_cost=5)
    assert plan == {1: Grant(1, 4), 2: Grant(1, 2)}
    assert spent(plan, 5) == 2 + (5 + 2) + (5 + 1) * 2


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"budget": 0}, "budget"),
        ({"budget": 4, "max_chunk": 0}, "max_chunk"),
        ({"budget": 4, "step_cost": -1}, "step_cost"),
    ],
)
def test_bad_arguments_are_refused(kwargs: dict[str, int], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        plan_tick([Demand(1, 1)], **{"max_chunk": 8, **kwargs})  # type: ignore[arg-type]


def test_bad_demands_are_refused() -> None:
    with pytest.raises(ValueError, match="at least one token"):
        Demand(1, 0)
    with pytest.raises(ValueError, match="decode"):
        Demand(1, 1, decode=0)
    with pytest.raises(ValueError, match="twice"):
        plan_tick([Demand(1, 1), Demand(1, 2)], budget=4, max_chunk=8)


@dataclass
class Sim:
    """One session of the simulation: frames of input tokens, each wanting ``decode`` tokens out."""

    frames: list[int]
    decode: int
    left: int = 0  # of the head frame, the fed-back token included
    answered: int = 0
    waited: int = 0
    decoded: list[int] = field(default_factory=list)


sessions_st = st.lists(
    st.tuples(st.lists(st.integers(0, 300), min_size=1, max_size=4), st.integers(1, 5)), min_size=1, max_size=8
)


@settings(max_examples=300, deadline=None)
@given(
    sessions=sessions_st,
    budget=st.integers(1, 80),
    max_chunk=st.integers(1, 64),
    step_cost=st.integers(0, 20),
)
def test_a_tick_never_exceeds_the_budget_and_every_input_token_is_appended(
    sessions: list[tuple[list[int], int]], budget: int, max_chunk: int, step_cost: int
) -> None:
    # a session's first frame carries input; later ones may be empty (the fed-back token alone)
    sims = {k: Sim(frames=[max(1, f[0]), *f[1:]], decode=d) for k, (f, d) in enumerate(sessions)}
    for s in sims.values():
        s.left = s.frames[0]
    accepted = sum(sum(s.frames) for s in sims.values())
    appended = fed_back = 0
    limit = accepted + 2 * sum(len(s.frames) for s in sims.values()) + 1
    for _ in range(limit):
        live = [k for k, s in sims.items() if s.answered < len(s.frames)]
        if not live:
            break
        demands = [Demand(k, sims[k].left, sims[k].decode, sims[k].answered > 0, sims[k].waited) for k in live]
        plan = plan_tick(demands, budget=budget, max_chunk=max_chunk, step_cost=step_cost)
        assert spent(plan, step_cost) <= budget
        assert sum(g.tokens for g in plan.values()) >= 1  # progress every tick
        for k in live:
            s, g = sims[k], plan[k]
            assert 0 <= g.chunk <= min(max_chunk, s.left)
            s.waited = 0 if g.chunk else s.waited + 1
            assert s.waited < len(sims)  # starvation-free: served within one round of the others
            s.left -= g.chunk
            appended += g.chunk
            if g.decode:
                assert s.left == 0 and 1 <= g.decode <= s.decode
                s.decoded.append(g.decode)
                appended += g.rounds
                s.answered += 1
                if s.answered < len(s.frames):
                    s.left = s.frames[s.answered] + 1  # the last decoded token is fed back with the next frame
                    fed_back += 1
            else:
                assert g.rounds == 0
    else:
        pytest.fail("the sessions' input was not all appended within one tick per token")
    decoded_extra = sum(d - 1 for s in sims.values() for d in s.decoded)
    assert appended == accepted + fed_back + decoded_extra  # nothing lost, nothing appended twice
    assert all(len(s.decoded) == len(s.frames) for s in sims.values())  # every frame answered
