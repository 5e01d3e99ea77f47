"""Model-based admission: a step-cost model predicts the next tick; an injected clock drives decisions."""

from __future__ import annotations

import anyio
import pytest

from metronome_engine import KVPolicy
from metronome_sdk import AdmissionConfig, Engine, InputFrame, LoadShed, Session, TimingConfig
from metronome_sdk._core.admission import MemoryGuard
from metronome_sdk._core.cost import StepCost
from metronome_sdk._core.model_admission import ModelAdmitter
from tests.sdk.conftest import CharTokenizer, FakeClock, make_engine
from tests.sdk.slowed import SlowedBackend

DEADLINE = 0.5  # seconds; target 1.0: the threshold is the deadline
PER = 9  # tokens a session appends a tick (8 input + its output), as in `bench admit`
# fixed 10 ms + 3 ms a token: 18 sessions (162 tokens, 496 ms) fit under 500 ms, 19 do not
CALIBRATION = [(1, 0.013), (101, 0.313)]


def admitter(clock: FakeClock, **cfg: object) -> ModelAdmitter:
    defaults = {"policy": "model", "session_tokens": PER, "target": 1.0, "percentile": 0.99, "min_samples": 4}
    config = AdmissionConfig(**{**defaults, **cfg})  # type: ignore[arg-type]
    return ModelAdmitter(config, deadline=DEADLINE, cost=StepCost(CALIBRATION), clock=clock)


def steps(a: ModelAdmitter, sessions: int, slowdown: float, count: int = 1) -> None:
    for _ in range(count):
        a.observe_step(sessions * PER, slowdown * a.cost.seconds(sessions * PER))


def decision(a: ModelAdmitter, clock: FakeClock, latency: float, in_flight: int) -> int:
    for _ in range(a.config.min_samples):
        a.observe(latency)
    clock.advance(a.config.interval)
    return a.update(in_flight)


def test_the_cap_is_what_the_model_says_a_tick_holds() -> None:
    a = admitter(FakeClock())
    assert a.fits() == 18
    assert a.update(16) == 18
    assert a.admits(17)
    assert not a.admits(18)


def test_the_cap_follows_the_least_tick_budget_of_the_last_ticks() -> None:
    budgets = [200, 120, 200]  # tokens: a brief dip, then the budget is back
    a = ModelAdmitter(
        AdmissionConfig(policy="model", session_tokens=PER, target=1.0, percentile=0.99, min_samples=4),
        deadline=DEADLINE,
        cost=StepCost(CALIBRATION),
        clock=FakeClock(),
        budget=lambda: budgets[0],
    )
    assert a.update(16) == 18  # 200 tokens hold 22 sessions: the model's 18 is the cap
    assert a.bound_by == "model"
    budgets.pop(0)
    assert a.update(12) == 13  # 120 tokens hold 13 sessions (117), not 14 (126)
    assert a.bound_by == "budget"
    budgets.pop(0)
    # back at 200, the dip is still among the last ticks: a session let in now would wait a tick when it returns
    assert a.update(13) == 13
    for _ in range(16):
        a.update(13)
    assert a.update(13) == 16  # the dip has left the window: growth resumes (sqrt(13), 3, at a time)


def test_sessions_not_yet_measured_count_at_their_full_cost() -> None:
    a = admitter(FakeClock())
    steps(a, 4, 1.0)  # the steps measured so far carried 4 sessions; 18 are admitted
    assert a.update(18) == 18
    assert not a.admits(18)


def test_between_two_ticks_it_admits_at_most_sqrt_n_beyond_those_in_flight() -> None:
    a = admitter(FakeClock())
    assert a.update(4) == 6
    assert a.update(9) == 12


def test_the_cap_never_falls_below_what_runs() -> None:
    clock = FakeClock()
    a = admitter(clock)
    assert a.update(25) == 25  # more run than fit: admit nobody, cut nobody
    assert not a.admits(25)
    steps(a, 25, 1.0)
    assert decision(a, clock, 0.45, in_flight=25) == 25  # the deadline is met: nobody is shed
    assert a.to_shed() == 0


def test_one_slow_step_moves_nothing_two_stop_admission() -> None:
    a = admitter(FakeClock())
    steps(a, 16, 1.0, count=3)
    steps(a, 16, 2.0)
    assert a.update(16) == 18
    steps(a, 16, 2.0)
    assert a.slowdown == pytest.approx(2.0)
    assert a.fits() == 8  # (250 ms - 10 ms) / 3 ms = 80 tokens
    assert a.update(16) == 16
    assert not a.admits(16)


def test_the_newest_are_shed_while_the_deadline_is_missed_a_share_at_a_time() -> None:
    clock = FakeClock()
    a = admitter(clock)
    steps(a, 16, 2.0, count=3)
    assert decision(a, clock, 0.9, in_flight=16) == 16  # the first late decision stops admission only
    assert a.to_shed() == 0
    steps(a, 16, 2.0, count=3)
    assert decision(a, clock, 0.9, in_flight=16) == 14  # still late: ceil(16 x 0.1) = 2 go
    assert a.to_shed() == 2
    assert a.to_shed() == 0  # told once
    steps(a, 14, 2.0, count=3)
    assert decision(a, clock, 0.9, in_flight=14) == 12
    assert a.to_shed() == 2


def test_one_late_decision_between_two_on_time_sheds_nobody() -> None:
    clock = FakeClock()
    a = admitter(clock)
    steps(a, 16, 2.0, count=3)
    for latency in (0.9, 0.45, 0.9, 0.45):  # a stall now and then, the deadline met in between
        assert decision(a, clock, latency, in_flight=16) == 16
        assert a.to_shed() == 0


def test_a_slow_machine_that_meets_the_deadline_sheds_nobody() -> None:
    clock = FakeClock()
    a = admitter(clock)
    steps(a, 16, 1.4, count=3)
    assert decision(a, clock, 0.48, in_flight=16) == 16
    assert a.to_shed() == 0


def test_it_admits_again_once_the_machine_has_recovered_for_a_while() -> None:
    clock = FakeClock()
    a = admitter(clock)
    steps(a, 16, 2.0, count=3)
    assert a.update(16) == 16
    steps(a, 16, 1.0, count=2)  # two of the last three at their cost, but not most of the last sixteen
    assert a.update(16) == 16
    steps(a, 16, 1.0, count=2)  # four of seven: the settled median is back at 1
    assert a.slowdown == pytest.approx(1.0)
    assert a.update(16) == 18


def test_a_brief_dip_admits_nobody_beyond_what_the_settled_steps_say() -> None:
    a = admitter(FakeClock())
    steps(a, 16, 1.0, count=16)
    steps(a, 16, 0.7, count=3)  # three fast steps: the recent median says 0.7, the last sixteen 1.0
    assert a.slowdown == pytest.approx(1.0)
    assert a.fits() == 18
    steps(a, 16, 0.7, count=6)  # nine of sixteen now: the machine is faster, and the cap grows
    assert a.slowdown == pytest.approx(0.7)
    assert a.fits() == 26  # (500 ms / 0.7 - 10 ms) / 3 ms = 234 tokens


def test_the_overhead_beyond_the_step_is_learned() -> None:
    clock = FakeClock()
    a = admitter(clock)
    steps(a, 10, 1.0, count=2)  # 280 ms steps
    decision(a, clock, 0.38, in_flight=10)
    assert a.overhead == pytest.approx(0.1)
    assert a.fits() == 14  # (400 ms - 10 ms) / 3 ms = 130 tokens


def test_a_miss_the_model_did_not_predict_scales_its_cost_up_and_decays_after() -> None:
    clock = FakeClock()
    a = admitter(clock)
    steps(a, 16, 1.0, count=2)  # 442 ms
    decision(a, clock, 0.452, in_flight=16)  # overhead 10 ms: the model predicts 452 ms
    steps(a, 16, 1.0, count=2)
    decision(a, clock, 0.55, in_flight=16)  # overhead moves to 37 ms: 479 ms predicted, 550 measured
    assert a.correction == pytest.approx(1 / 0.9)
    steps(a, 16, 1.0, count=2)
    decision(a, clock, 0.45, in_flight=16)
    assert a.correction == pytest.approx(1 / 0.9 - 0.02)


def test_a_second_signal_caps_admission_by_name() -> None:
    a = admitter(FakeClock())
    a.constrain("voice", 5)
    assert a.update(4) == 5
    a.constrain("voice", None)
    assert a.update(4) == 6


def test_the_watchdog_cut_stops_admission_at_what_runs() -> None:
    a = admitter(FakeClock())
    a.update(10)
    assert a.cut() == 10


def test_the_cap_names_the_term_that_set_it() -> None:
    a = admitter(FakeClock())
    assert a.bound_by == "start"
    assert a.update(16) == 18 and a.bound_by == "model"
    assert a.update(4) == 6 and a.bound_by == "burst"
    assert a.update(25) == 25 and a.bound_by == "running"
    a.constrain("voice", 5)
    assert a.update(4) == 5 and a.bound_by == "voice"
    a.constrain("voice", None)
    assert a.cut() == 4 and a.bound_by == "slow_step"
    guarded = ModelAdmitter(
        AdmissionConfig(policy="model", session_tokens=PER),
        deadline=DEADLINE,
        cost=StepCost(CALIBRATION),
        guard=MemoryGuard(pool_blocks=50, session_blocks=5),
    )
    assert guarded.update(9) == 10 and guarded.bound_by == "memory"  # the burst would be 12, the pool holds 10
    capped = ModelAdmitter(
        AdmissionConfig(policy="model", session_tokens=PER, max_limit=7), deadline=DEADLINE, cost=StepCost(CALIBRATION)
    )
    assert capped.update(6) == 7 and capped.bound_by == "max_limit"


def test_nothing_measured_keeps_the_starting_cap() -> None:
    a = ModelAdmitter(AdmissionConfig(policy="model", initial_limit=3), deadline=DEADLINE, cost=StepCost())
    assert a.update(2) == 3


def test_policy_is_checked_when_made() -> None:
    with pytest.raises(ValueError, match="policy must be 'aimd' or 'model'"):
        AdmissionConfig(policy="pid")  # type: ignore[arg-type]


@pytest.mark.timeout(60)
async def test_an_engine_under_the_model_policy_never_caps_below_its_sessions() -> None:
    admission = AdmissionConfig(policy="model", max_limit=64, queue_timeout=0.0)
    async with make_engine(admission=admission) as engine:
        sessions = [engine.try_session() for _ in range(3)]
        for _ in range(5):
            for s in sessions:
                await s.step(InputFrame.from_tokens([5, 6]))
            stats = engine.stats()
            assert stats.limit >= stats.sessions == 3
            assert stats.limit_bound_by in ("model", "budget", "burst", "running", "max_limit")
        for s in sessions:
            await s.aclose()


@pytest.mark.timeout(120)
async def test_a_machine_that_slows_sheds_the_newest_sessions_with_load_shed() -> None:
    # 5 ms + 2 ms a token; each session appends 3 tokens + its output a tick: 4 fit an 80 ms deadline easily.
    # Then every step costs 100 ms more (another process took the core): past the deadline, whatever is shed.
    core = SlowedBackend(KVPolicy.windowed(8, sinks=4), fixed=0.005, per_token=0.002)
    admission = AdmissionConfig(policy="model", session_tokens=4, min_samples=4, interval=0.2, queue_timeout=0.0)
    engine = Engine(core=core, timing=TimingConfig(period=0.08), admission=admission, tokenizer=CharTokenizer())
    shed: dict[int, LoadShed] = {}
    async with engine:
        sessions = [engine.try_session() for _ in range(4)]
        for s in sessions:
            await s.step(InputFrame.from_tokens([5, 6, 7]))
        core.fixed += 0.1

        async def talk(s: Session) -> None:
            try:
                for _ in range(30):
                    await s.step(InputFrame.from_tokens([5, 6, 7]))
                    stats = engine.stats()
                    assert stats.limit >= stats.sessions  # never a cap below what runs
            except LoadShed as exc:
                shed[s.id] = exc

        async with anyio.create_task_group() as tg:
            for s in sessions:
                tg.start_soon(talk, s)
        for s in sessions:
            await s.aclose()
    assert shed, "a machine that misses every deadline shed nobody"
    assert sessions[0].id not in shed  # the oldest is never shed first, and the last open never
    assert sorted(shed) == [s.id for s in sessions[len(sessions) - len(shed) :]]  # the newest went
    assert all(e.retry_after > 0 for e in shed.values())
