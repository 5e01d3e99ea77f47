"""Traffic that is not nominal: a session's tokens per frame drawn from a conversation's pieces.

A conversation opens with a user turn, then alternates seeded *segments*: silence (a frame of
one token, what an audio codec emits for a quiet frame, plus the model's own fed-back token),
a short user turn (speech frames of ``speech_tokens`` tokens, as ``FixedRateCodec`` makes
them), and a long answer (quiet input frames whose output carries several tokens a tick, as a
speaking model's does). No frame is empty: a frame after a stalled one must carry input. Each segment's kind,
length and answer rate come from one generator per session, so a run is repeatable and no
two sessions grow alike: the growth rate behind ``t_sat`` has to be measured.
"""

from __future__ import annotations

import bisect
import random
from dataclasses import dataclass, field

from .workload import FrameLoad, SessionPlan

__all__ = ["Segment", "Talk", "TalkMix", "talks"]


@dataclass(frozen=True, slots=True, kw_only=True)
class TalkMix:
    """The distribution segments are drawn from (seconds; shares of segments, not of time)."""

    silence: float = 0.35
    turn: float = 0.40
    answer: float = 0.25
    silence_s: tuple[float, float] = (0.5, 4.0)
    turn_s: tuple[float, float] = (0.8, 3.0)
    answer_s: tuple[float, float] = (2.0, 8.0)
    speech_tokens: int = 8
    answer_tokens: tuple[int, int] = (2, 6)  # tokens a tick while the model answers

    def __post_init__(self) -> None:
        if min(self.silence, self.turn, self.answer) < 0 or self.silence + self.turn + self.answer <= 0:
            raise ValueError("segment shares must be >= 0 and not all 0")
        for name in ("silence_s", "turn_s", "answer_s"):
            lo, hi = getattr(self, name)
            if not 0 < lo <= hi:
                raise ValueError(f"{name} must be (lo, hi) seconds with 0 < lo <= hi, got {(lo, hi)}")
        lo_t, hi_t = self.answer_tokens
        if not 1 <= lo_t <= hi_t or self.speech_tokens < 1:
            raise ValueError(f"token counts must be >= 1, got {self.speech_tokens} and {self.answer_tokens}")


@dataclass(frozen=True, slots=True)
class Segment:
    kind: str  # "silence", "turn" or "answer"
    frames: int
    load: FrameLoad


@dataclass(slots=True)
class Talk:
    """One session's conversation, frame by frame, drawn as far as it is asked."""

    seed: int
    period: float
    mix: TalkMix = field(default_factory=TalkMix)
    segments: list[Segment] = field(default_factory=list)
    _rng: random.Random = field(init=False, repr=False)
    _ends: list[int] = field(default_factory=list, repr=False)  # frame index where each segment ends

    def __post_init__(self) -> None:
        if not self.period > 0:
            raise ValueError(f"period must be > 0 seconds, got {self.period}")
        self._rng = random.Random(self.seed)

    def load(self, frame: int) -> FrameLoad:
        """What the session sends as its ``frame``-th frame."""
        if frame < 0:
            raise ValueError(f"frame index must be >= 0, got {frame}")
        while not self._ends or self._ends[-1] <= frame:
            self._draw()
        return self.segments[bisect.bisect_right(self._ends, frame)].load

    def _draw(self) -> None:
        m, rng = self.mix, self._rng
        kind = rng.choices(("silence", "turn", "answer"), weights=(m.silence, m.turn, m.answer))[0]
        if not self.segments:
            kind = "turn"  # the user speaks first: a session's first frame must carry input
        seconds = rng.uniform(*getattr(m, f"{kind}_s"))
        if kind == "silence":
            load = FrameLoad(1)
        elif kind == "turn":
            load = FrameLoad(m.speech_tokens)
        else:
            load = FrameLoad(1, decode=rng.randint(*m.answer_tokens))
        frames = max(1, round(seconds / self.period))
        self.segments.append(Segment(kind, frames, load))
        self._ends.append((self._ends[-1] if self._ends else 0) + frames)


def talks(plans: list[SessionPlan], *, seed: int, period: float, mix: TalkMix | None = None) -> dict[int, Talk]:
    """One seeded conversation per planned session."""
    return {p.index: Talk(seed * 1_000_003 + p.index, period, mix or TalkMix()) for p in plans}
