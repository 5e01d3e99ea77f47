"""The step on the core thread: open new sessions' sequences, one batched step, extra decode rounds.

Runs on the engine core's own thread (``worker.py``), never on the event loop. A step that
raises has changed nothing (the core rolls back), so it is retried at once, ``retries``
times: a transient fault costs one step's time, not a frame. Sessions granted several
tokens this tick (``Session.decode_tokens``) get extra decode rounds, each a step of its own.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass

from metronome_engine import EngineBackend, PoolStats, SamplingParams, Stall, StepOutput, StepRequest

from .._log import get_logger
from .channel import DecodeRounds

__all__: list[str] = []  # internal: StepPart, StepResult, run_tick_step


@dataclass(frozen=True, slots=True)
class StepPart:
    """One session's part of the tick, as the core thread sees it."""

    seq_id: int | None  # None: open its sequence first
    sampling: SamplingParams | None
    tokens: list[int]
    sample: bool  # the frame's last token is in this chunk: sample its output
    decode: int  # tokens to decode for the frame this tick (the budget's grant)
    pinned: int = 0  # a new sequence's pinned prefix (its system prompt), in tokens
    rounds: DecodeRounds | None = None  # the frame's extra decode rounds, which an interrupt stops


@dataclass(slots=True)
class StepResult:
    seq_ids: list[int]
    outputs: list[StepOutput]  # each session's last step output (its state after the tick)
    tokens: list[tuple[int, ...]]  # each session's decoded tokens (several with extra decode rounds)
    steps: list[tuple[int, float]]  # (tokens, seconds) of each step run: what the cost model learns from
    pool: PoolStats
    step_seconds: float
    error: BaseException | None
    failures: int  # attempts that raised (retried ones included)
    raised: BaseException | None  # the last exception a try raised, even if a retry then succeeded


def run_tick_step(core: EngineBackend, work: Sequence[StepPart], retries: int, stop_ids: frozenset[int]) -> StepResult:
    seq_ids = [
        w.seq_id
        if w.seq_id is not None
        else core.add_sequence(sampling=w.sampling, **({"pinned": w.pinned} if w.pinned else {}))  # type: ignore[arg-type]
        for w in work
    ]
    requests = [StepRequest(sid, w.tokens, sample=w.sample) for sid, w in zip(seq_ids, work, strict=True)]
    t0 = time.perf_counter()
    outputs: list[StepOutput] = []
    error: BaseException | None = None
    raised: BaseException | None = None
    failures = 0
    for _ in range(retries + 1):
        try:
            outputs, error = core.step(requests), None
            break
        except Exception as exc:  # every session of the tick hears of it if no retry succeeds
            failures += 1
            error = raised = exc
    steps = [(sum(len(r.tokens) for r in requests), time.perf_counter() - t0)] if error is None else []
    tokens: list[tuple[int, ...]] = [(o.token,) if o.token is not None else () for o in outputs]
    if error is None:
        rounds = [w.rounds for w in work]
        outputs = _decode_rounds(core, seq_ids, [w.decode for w in work], rounds, outputs, tokens, steps, stop_ids)
    seconds = time.perf_counter() - t0
    return StepResult(seq_ids, outputs, tokens, steps, core.pool_stats(), seconds, error, failures, raised)


def _decode_rounds(
    core: EngineBackend,
    seq_ids: list[int],
    decode: list[int],
    rounds: list[DecodeRounds | None],
    outputs: list[StepOutput],
    tokens: list[tuple[int, ...]],
    steps: list[tuple[int, float]],
    stop: frozenset[int],
) -> list[StepOutput]:
    """Extra decode rounds: each appends a session's last token and samples the next.

    A session leaves the rounds at its stop token, when its frame is interrupted, or when the
    pool cannot take its token (it keeps what it decoded; the token goes back with its next
    frame, as always). A
    round that raises changed nothing: the rounds end there, the tokens so far stand.
    """
    outputs = list(outputs)
    going = [i for i, n in enumerate(decode) if n > 1 and tokens[i] and tokens[i][-1] not in stop]
    done = 1
    while going:
        # an interrupted frame begins no more rounds: its tokens appended so far are all it leaves
        going = [i for i in going if (r := rounds[i]) is None or r.begin()]
        if not going:
            break
        t0 = time.perf_counter()
        try:
            outs = core.step([StepRequest(seq_ids[i], [tokens[i][-1]], sample=True) for i in going])
        except Exception as exc:  # the frame keeps the tokens decoded so far
            get_logger().warning("engine.decode_round_failed", error=repr(exc), round=done)
            _undo(rounds, going)
            break
        steps.append((len(going), time.perf_counter() - t0))
        done += 1
        still = []
        for i, out in zip(going, outs, strict=True):
            if out.stall is Stall.NUMERIC_FAULT:
                outputs[i] = out  # the core dropped the session: it breaks, as in the main step
                continue
            if out.stall is not None or out.token is None:
                _undo(rounds, [i])
                continue  # the pool is full: no more this tick
            outputs[i] = out
            tokens[i] = (*tokens[i], out.token)
            if decode[i] > done and out.token not in stop:
                still.append(i)
        going = still
    return outputs


def _undo(rounds: list[DecodeRounds | None], which: list[int]) -> None:
    for i in which:
        if (r := rounds[i]) is not None:
            r.undo()
