"""The one t_sat formula and the growth rate it divides by, on made-up ticks."""

from __future__ import annotations

import pytest

from metronome_sdk import TimingConfig
from metronome_sdk._core.growth import GrowthRate, t_sat


def test_t_sat_is_free_blocks_over_the_sessions_growth() -> None:
    assert t_sat(58, 1, 1.0) == pytest.approx(58.0)
    assert t_sat(100, 4, 2.5) == pytest.approx(10.0)
    assert t_sat(-3, 4, 2.5) == 0.0  # over-full: now
    assert t_sat(100, 0, 2.5) is None  # nobody fills it
    assert t_sat(100, 4, 0.0) is None  # nothing grows


def test_the_share_form_is_the_same_number() -> None:
    pool, used, n, blocks_per_s = 152, 40, 8, 7.03
    rho0, r_share = used / pool, blocks_per_s / pool
    assert t_sat(pool - used, n, blocks_per_s) == pytest.approx((1 - rho0) / (n * r_share))


def test_rate_is_blocks_per_session_second_over_the_window() -> None:
    rate = GrowthRate(window=2.0)
    for _ in range(4):
        rate.observe(0.5, 2, 2)  # 2 sessions, 2 blocks each half second: 2 blocks/s per session
    assert rate.rate() == pytest.approx(2.0)
    for _ in range(4):
        rate.observe(0.5, 6, 3)  # 3 sessions at 4 blocks/s each
    assert rate.rate() == pytest.approx(4.0)  # the old ticks have left the 2 s window


def test_a_longer_window_remembers_more() -> None:
    short, long = GrowthRate(window=1.0), GrowthRate(window=10.0)
    for g in (4, 4, 4, 4, 0, 0):
        short.observe(0.5, g, 1)
        long.observe(0.5, g, 1)
    assert short.rate() == 0.0  # the last second grew nothing
    assert long.rate() == pytest.approx(16 / 3.0)


def test_no_ticks_no_rate_and_the_window_must_be_positive() -> None:
    assert GrowthRate(window=5.0).rate() == 0.0
    with pytest.raises(ValueError, match="growth window"):
        GrowthRate(window=0.0)
    with pytest.raises(ValueError, match="growth_window"):
        TimingConfig(growth_window=-1.0)
