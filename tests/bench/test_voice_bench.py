"""``metronome bench voice``: its options, and the arithmetic it reports (the real run: tests/webrtc)."""

from __future__ import annotations

import argparse

import numpy as np
import pytest

from metronome_bench.commands.bench_voice import parse_callers, parse_voices
from metronome_bench.voice import (
    FRAME,
    LOUD,
    SpokenQuestion,
    TurnResult,
    last_speech_frame,
    nearest_rank,
    rms,
    rtvi_stages,
    rtvi_text,
    summarize,
    to_caller_rate,
)
from metronome_sdk.cli import build_parser


def test_callers_parse_and_refuse() -> None:
    assert parse_callers("1,2,4") == (1, 2, 4)
    assert parse_callers(" 3 ") == (3,)
    for bad in ("", "0", "1,x", "17", "-1"):
        with pytest.raises(argparse.ArgumentTypeError, match="--callers"):
            parse_callers(bad)


def test_voices_parse_and_refuse() -> None:
    assert parse_voices("espeak-en-us,piper-joe") == ("espeak-en-us", "piper-joe")
    with pytest.raises(argparse.ArgumentTypeError, match="piper-joe"):
        parse_voices("robot")


def test_the_command_is_registered_with_its_defaults() -> None:
    args = build_parser().parse_args(["bench", "voice"])
    assert (args.callers, args.turns, args.voices, args.server, args.json) == (
        (1, 2, 4),
        3,
        ("piper-joe", "espeak-en-us"),
        None,
        False,
    )
    args = build_parser().parse_args(["bench", "voice", "--callers", "2", "--json", "--server", "http://h:1/"])
    assert (args.callers, args.json, args.server) == ((2,), True, "http://h:1/")


def test_bad_options_exit_with_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--callers", "0"], ["--turns", "0"], ["--voices", "x"]):
        with pytest.raises(SystemExit) as exc:
            build_parser().parse_args(["bench", "voice", *argv])
        assert exc.value.code == 2
    assert "--callers counts must be in [1, 16]" in capsys.readouterr().err


def test_nearest_rank_is_a_measured_value() -> None:
    assert nearest_rank([], 50) is None
    assert nearest_rank([3.0], 95) == 3.0
    values = [0.5, 0.1, 0.4, 0.2, 0.3]
    assert nearest_rank(values, 50) == 0.3
    assert nearest_rank(values, 95) == 0.5
    assert nearest_rank(list(range(1, 101)), 95) == 95


def test_rms_and_the_last_speech_frame() -> None:
    assert rms(np.zeros(0, dtype=np.int16)) == 0.0
    full = np.full(FRAME, 32767, dtype=np.int16)
    assert rms(full) == pytest.approx(1.0, abs=1e-4)
    quiet = np.full(FRAME, round(0.5 * LOUD * 32768), dtype=np.int16)
    loud = np.full(FRAME, round(2 * LOUD * 32768), dtype=np.int16)
    pcm = np.concatenate([quiet, loud, quiet, loud, quiet, quiet])
    assert last_speech_frame(pcm) == 3
    assert last_speech_frame(np.concatenate([quiet, quiet])) == -1
    with pytest.raises(ValueError, match="said nothing"):
        SpokenQuestion("Hello?", "mute", np.zeros(FRAME, dtype=np.int16))


def test_to_caller_rate_keeps_the_duration() -> None:
    pcm = (1000 * np.sin(np.arange(22050) / 10)).astype(np.int16)
    up = to_caller_rate(pcm, 22050)
    assert up.dtype == np.int16 and up.size == 48000
    assert to_caller_rate(up, 48000).size == 48000


def _turn(v2v: float | None, server: dict[str, float] | None) -> TurnResult:
    return TurnResult(2, 0, "q?", "piper-joe", v2v, "q", "a.", server)


def test_summarize_counts_missing_replies_and_takes_stage_medians() -> None:
    results = [
        _turn(1.0, {"voice_to_voice": 0.9, "transcribe": 0.3}),
        _turn(2.0, {"voice_to_voice": 1.9, "transcribe": 0.5}),
        _turn(None, None),
        _turn(3.0, {"voice_to_voice": 2.9, "transcribe": 0.7, "send": float("nan")}),
    ]
    s = summarize(2, results)
    assert (s["turns"], s["no_reply"], s["p50"], s["p95"], s["max"]) == (4, 1, 2.0, 3.0, 3.0)
    assert s["server_median"] == {"voice_to_voice": 1.9, "transcribe": 0.5}
    assert s["results"][2]["voice_to_voice"] is None


def test_summarize_counts_the_reply_frames_that_missed_their_deadline() -> None:
    results = [
        TurnResult(1, 0, "q?", "piper-joe", 0.8, "q", "a.", None, frames=(1, 4, 4, 2), late=1),
        TurnResult(1, 0, "q?", "piper-joe", 0.9, "q", "a.", None, frames=(1, 3), late=0),
    ]
    s = summarize(1, results)
    assert (s["frames"], s["late_frames"]) == (6, 1)
    assert [r["late"] for r in s["results"]] == [1, 0]


def _rtvi(kind: str, **data: object) -> dict[str, object]:
    return {"label": "rtvi-ai", "type": kind, **({"data": data} if data else {})}


def test_a_pipecat_bots_rtvi_messages_give_its_transcripts_and_its_stages() -> None:
    events = [
        _rtvi("user-transcription", text=" What is  the", final=False),
        _rtvi("user-transcription", text=" What is the capital of France? ", final=True),
        _rtvi("user-stopped-speaking"),
        {"type": "transcript", "role": "user", "text": "not pipecat's", "final": True},
        _rtvi("bot-llm-text", text="The"),
        _rtvi("bot-llm-text", text=" capital"),
        _rtvi("bot-started-speaking"),
        _rtvi("bot-transcription", text="The capital of France is Paris."),
    ]
    received = [10.2, 10.4, 10.5, 10.5, 10.7, 10.75, 11.0, 11.1]
    assert rtvi_text(events, "user-transcription") == ["What is the capital of France?"]  # the final one
    assert rtvi_text(events, "bot-transcription") == ["The capital of France is Paris."]
    stages = rtvi_stages(events, received, spoken_at=10.0)
    assert stages == pytest.approx({"heard": 0.4, "turn_end": 0.1, "first_token": 0.2, "first_audio_sent": 0.3})
    # stages count only what came after the end of speech, and stop at the first one missing
    assert rtvi_stages(events, received, spoken_at=10.45) == pytest.approx({})
    assert rtvi_stages(events[:3], received[:3], spoken_at=10.0) == pytest.approx({"heard": 0.4, "turn_end": 0.1})
