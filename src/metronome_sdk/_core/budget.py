"""The per-tick token budget: how many tokens a tick appends, and which session appends how many.

``tick_budget`` sizes a tick from the measured step cost (``TimingConfig.tick_tokens``).

A tick's step time grows with the tokens it appends, so a tick that took every session's
whole chunk at once (four newcomers' prompts, say) ran for seconds and every session in
it missed its beat. ``plan_tick`` caps a tick's tokens at a budget (``tick_budget``, from
the measured cost per token, so that a tick fits the deadline) and shares it out:

1. the session that has waited longest on the budget gets a fair share first (no session
   waits forever, whatever the others ask);
2. sessions already talking get their frame's input (smallest first: a decode frame is
   one token), so their beat holds;
3. newcomers' prefill takes what is left, longest waiting first, spread over ticks;
4. sessions whose frame ends this tick and that want more than one token decoded get
   extra decode rounds, each round a step of its own, charged ``step_cost`` tokens for
   the step's fixed cost plus one token per session in it.

A session granted nothing waits this tick; the caller counts and reports the wait.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from .._config import TimingConfig
from .cost import StepCost

__all__: list[str] = []  # internal: Demand, Grant, plan_tick, tick_budget, measured_tokens


@dataclass(frozen=True, slots=True)
class Demand:
    """One session's head frame, as the tick sees it."""

    key: int  # the session
    input: int  # tokens still to append for this frame (the last output fed back included)
    decode: int = 1  # tokens the frame wants decoded once its input is in
    talking: bool = False  # answered before: its beat comes before newcomers' prefill
    waited: int = 0  # ticks in a row it had input and was granted nothing

    def __post_init__(self) -> None:
        if self.input < 1:
            raise ValueError(f"a demand appends at least one token, got input={self.input} for session {self.key}")
        if self.decode < 1:
            raise ValueError(f"decode must be >= 1, got {self.decode} for session {self.key}")
        if self.waited < 0:
            raise ValueError(f"waited must be >= 0, got {self.waited} for session {self.key}")


@dataclass(frozen=True, slots=True)
class Grant:
    """What one session does this tick: append ``chunk`` tokens, then decode ``decode`` (0: not yet)."""

    chunk: int
    decode: int

    @property
    def rounds(self) -> int:
        """Extra decode steps after the tick's main step (each appends the token decoded before)."""
        return max(0, self.decode - 1)

    @property
    def tokens(self) -> int:
        """Tokens this grant appends this tick."""
        return self.chunk + self.rounds


def plan_tick(demands: list[Demand], *, budget: int | None, max_chunk: int, step_cost: int = 0) -> dict[int, Grant]:
    """Each demand's grant for this tick; the tokens granted, plus ``step_cost`` per extra
    decode round, never exceed ``budget`` (``None``: no budget, every chunk goes whole)."""
    if max_chunk < 1:
        raise ValueError(f"max_chunk must be >= 1, got {max_chunk}")
    if budget is not None and budget < 1:
        raise ValueError(f"budget must be >= 1 token (or None), got {budget}")
    if step_cost < 0:
        raise ValueError(f"step_cost must be >= 0 tokens, got {step_cost}")
    keys = [d.key for d in demands]
    if len(set(keys)) != len(keys):
        raise ValueError("a session appears twice in one tick's demands")
    left = sys.maxsize if budget is None else budget
    chunk = dict.fromkeys(keys, 0)

    def give(d: Demand, want: int) -> None:
        nonlocal left
        n = max(0, min(want, max_chunk - chunk[d.key], d.input - chunk[d.key], left))
        chunk[d.key] += n
        left -= n

    waiting = [d for d in demands if d.waited > 0]
    if waiting:
        oldest = max(waiting, key=lambda d: d.waited)  # the first of equals: input order breaks ties
        give(oldest, max(1, left // len(demands)))
    for d in sorted((d for d in demands if d.talking), key=lambda d: (-d.waited, d.input)):
        give(d, d.input)
    for d in sorted((d for d in demands if not d.talking), key=lambda d: -d.waited):
        give(d, d.input)
    decode = {d.key: (1 if chunk[d.key] == d.input else 0) for d in demands}
    # extra decode rounds: a round is one more step, worth running only whole for who is in it
    more = [d for d in demands if decode[d.key] and d.decode > 1]
    rnd = 1
    while more and left > step_cost:
        fits = more[: left - step_cost]
        left -= step_cost + len(fits)
        for d in fits:
            decode[d.key] += 1
        rnd += 1
        more = [d for d in fits if d.decode > rnd]
    return {d.key: Grant(chunk[d.key], decode[d.key]) for d in demands}


def tick_budget(timing: TimingConfig, cost: StepCost) -> int | None:
    """Most tokens one tick appends (``TimingConfig.tick_tokens``); ``None``: no cap."""
    fixed = timing.tick_tokens
    if fixed != "auto":
        return fixed
    measured = measured_tokens(timing, cost)
    return measured if measured is not None else timing.max_chunk_tokens  # unmeasured: one chunk a tick


def measured_tokens(timing: TimingConfig, cost: StepCost) -> int | None:
    """The tokens a tick appends within ``step_share`` of the deadline, by the measured cost."""
    if not cost.ready:
        return None
    fits = cost.tokens_within(timing.step_share * timing.frame_deadline)
    # never below one step's fixed cost in tokens: a smaller tick saves little time and wastes the step
    return max(1, fits, min(cost.step_tokens(), timing.max_chunk_tokens))
