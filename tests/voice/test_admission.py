"""``VoiceAdmission``: a caller more only while the model and the recent turns say every caller fits the objective."""

from __future__ import annotations

import json
import time

import pytest

from metronome_sdk import AdmissionRejected
from metronome_sdk.voice import TurnLatency
from metronome_sdk.voice._admission import VoiceAdmission

pytestmark = pytest.mark.timeout(10)


def test_the_model_adds_one_turn_of_speech_work_per_caller() -> None:
    admission = VoiceAdmission(2.0)
    assert admission.predict(1) is None and admission.capacity() == 1
    admission.calibrate(work=0.4, rest=0.6)
    assert admission.predict(1) == pytest.approx(1.0)
    assert admission.predict(3) == pytest.approx(1.8)
    assert admission.capacity() == 3  # 0.6 + 3 * 0.4 = 1.8 <= 2.0 < 2.2
    admission.admit(2)  # the third caller: 1.8 s
    with pytest.raises(AdmissionRejected) as refused:
        admission.admit(3)  # the fourth: 2.2 s
    assert refused.value.limit == 3 and refused.value.in_flight == 3
    assert refused.value.retry_after == admission.retry_after
    assert "4 calls would reach 2.20 s" in str(refused.value)
    assert admission.stats()["refused"] == 1


def test_a_lone_caller_is_always_served() -> None:
    admission = VoiceAdmission(0.5)
    admission.calibrate(work=1.0, rest=2.0)  # slower than the objective even alone
    admission.admit(0)
    admission.observe(voice_to_voice=3.0, speech=1.0, callers=1)
    admission.admit(0)
    with pytest.raises(AdmissionRejected):
        admission.admit(1)
    assert admission.capacity() == 1


def test_nothing_measured_leaves_the_decision_to_the_engine() -> None:
    admission = VoiceAdmission(1.0)
    for callers in range(8):
        admission.admit(callers)  # no probe, no turn: no refusal of its own
    assert admission.stats()["refused"] == 0


def test_turns_take_over_from_the_probe() -> None:
    admission = VoiceAdmission(2.0)
    admission.calibrate(work=0.1, rest=0.1)
    assert admission.capacity() == 19
    for _ in range(4):  # a caller alone: 0.5 s of speech work, 0.4 s of the rest
        admission.observe(voice_to_voice=0.9, speech=0.5, callers=1)
    assert admission.predict(2) == pytest.approx(0.4 + 2 * 0.5)
    assert admission.capacity() == 3
    # turns that overlapped others say nothing of one turn's work, only of the rest and the p95
    admission.observe(voice_to_voice=1.6, speech=1.2, callers=2)
    assert admission.stats()["work_s"] == pytest.approx(0.5)


def test_a_turn_counts_the_speech_work_done_during_its_pause() -> None:
    # heard and answered ahead: the transcription and the first part ran before the turn ended, so
    # the parts show no wait for them; callers whose pauses coincide still queue for that work
    ahead = TurnLatency(0.6, 0.25, 0.0, 0.05, 0.15, 0.0, 0.15, ahead=True, speech_work=0.3)
    typed = TurnLatency(0.6, 0.0, 0.0, 0.2, 0.2, 0.1, 0.1)  # nothing recognized here: its parts stand
    admission = VoiceAdmission(2.0)
    for _ in range(3):
        admission.observe_turn(ahead, callers=1)
    assert admission.stats()["work_s"] == pytest.approx(0.3)
    assert admission.predict(3) == pytest.approx(0.3 + 3 * 0.3)
    other = VoiceAdmission(2.0)
    other.observe_turn(typed, callers=1)
    assert other.stats()["work_s"] == pytest.approx(0.1)
    # the latency event stays JSON a browser parses: an unknown speech_work is null, not NaN
    assert json.loads(json.dumps(typed.event(), allow_nan=False))["speech_work"] is None
    assert ahead.event()["speech_work"] == pytest.approx(0.3)


def test_recent_turns_past_the_objective_stop_admission_at_once() -> None:
    # the model says 3 fit, but another process took a core: the turns heard are slow
    admission = VoiceAdmission(1.5)
    admission.calibrate(work=0.3, rest=0.5)
    admission.admit(1)
    for _ in range(3):
        admission.observe(voice_to_voice=2.5, speech=0.3, callers=2)
    with pytest.raises(AdmissionRejected, match=r"recent turns' voice-to-voice p95 is 2\.50 s"):
        admission.admit(1)


def test_recovery_when_the_slow_turns_age_out() -> None:
    admission = VoiceAdmission(1.5, horizon=0.01)
    admission.calibrate(work=0.3, rest=0.5)
    admission.observe(voice_to_voice=2.5, speech=0.3, callers=2)
    time.sleep(0.02)
    admission.admit(1)  # the slow turn is older than the horizon
    assert admission.stats()["recent_turns"] == 0


def test_figures_that_did_not_happen_are_not_observed() -> None:
    admission = VoiceAdmission(1.5)
    admission.observe(voice_to_voice=float("nan"), speech=0.3, callers=1)
    admission.observe(voice_to_voice=1.0, speech=float("inf"), callers=1)
    admission.observe(voice_to_voice=1.0, speech=0.3, callers=0)
    assert admission.stats()["recent_turns"] == 0


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"objective": 0}, "objective must be a positive"),
        ({"objective": float("inf")}, "objective must be a positive"),
        ({"objective": True}, "objective must be a positive"),
        ({"objective": 1.0, "window": 2}, "window must be an int >= 4"),
        ({"objective": 1.0, "retry_after": -1}, "retry_after must be a positive"),
    ],
)
def test_bad_settings_are_refused(kwargs: dict[str, float], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        VoiceAdmission(**kwargs)  # type: ignore[arg-type]


def test_a_bad_calibration_is_refused() -> None:
    with pytest.raises(ValueError, match="work must be a finite"):
        VoiceAdmission(1.0).calibrate(work=float("nan"), rest=0.1)


def test_what_the_caller_waits_unseen_counts_in_the_model_and_the_feedback() -> None:
    admission = VoiceAdmission(2.0, unseen=0.3)
    admission.calibrate(work=0.4, rest=0.6)
    assert admission.predict(1) == pytest.approx(1.3)  # 0.3 + 0.6 + 0.4
    assert admission.capacity() == 2  # 0.3 + 0.6 + 2 * 0.4 = 1.7 <= 2.0 < 2.1
    with pytest.raises(AdmissionRejected, match=r"3 calls would reach 2\.10 s"):
        admission.admit(2)
    admission = VoiceAdmission(2.0, unseen=0.3)
    for _ in range(4):  # 1.8 s on the server's clock: 2.1 s as the caller hears it
        admission.observe(voice_to_voice=1.8, speech=0.1, callers=1)
    with pytest.raises(AdmissionRejected, match=r"p95 is 2\.10 s as the callers hear it"):
        admission.admit(1)
    assert admission.stats()["unseen_s"] == 0.3
    for bad in (-0.1, float("inf"), True):
        with pytest.raises(ValueError, match="unseen must be a finite number of seconds"):
            VoiceAdmission(2.0, unseen=bad)
