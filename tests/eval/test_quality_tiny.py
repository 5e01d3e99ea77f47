"""``eval quality`` end to end on the tiny random model: the pieces fit and the JSON has the issue's shape."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

import metronome_bench.commands.eval_quality as eval_quality
from metronome_bench.eval.outputs import write_outputs
from metronome_bench.eval.quality import QualityConfig, full_policy, run_quality
from metronome_engine import KVPolicy
from metronome_sdk.cli import build_parser, main
from tests.engine.tiny import tiny_hf, tiny_runner

from .fakes import CharTokenizer

TEXT = "The quick brown fox jumps over the lazy dog, and the dog sleeps on. " * 12


def _config() -> QualityConfig:
    return QualityConfig.quick(
        tokens=240, windows=(16, 32), slices=4, oracle_budget=256, gen_tokens=40, gen_window=16, dialog_turns=2
    )


def test_report_relations_and_shape(tmp_path: Path) -> None:
    model, tok = tiny_runner(tiny_hf(0)), CharTokenizer()
    stream = tok.encode(TEXT)
    report = run_quality(
        model, tok, stream, text="fox", text_sha256="0", passages=["alpha " * 8, "beta " * 8], config=_config()
    )
    data = report.as_json()
    assert data["tokens"] == 241 and data["scored_tokens"] == 240
    kinds = [(r["policy"], r["window"], r["sinks"]) for r in data["results"]]
    assert kinds == [
        ("full", None, 0),
        ("window", 16, 0),
        ("window", 16, 4),
        ("recompute", 16, 0),
        ("window", 32, 0),
        ("window", 32, 4),
        ("recompute", 32, 0),
    ]
    for r in data["results"]:
        assert isinstance(r["ppl"], float) and len(r["ppl_by_slice"]) == 4
    # before the window first slides every policy sees the whole text: identical scores
    full, plain = report.full.nll, report.windowed[(32, 0)].nll
    assert plain[:32] == pytest.approx(full[:32], rel=1e-4)
    # positions per slice: oracle_budget / W (16 for W=16), and the oracle agrees with the
    # streamed policies where they see the same tokens (positions < W)
    assert [len(p) for p in report.oracle_positions[16]] == [16, 16, 16, 16]
    first = report.oracle_positions[32][0][0]
    assert first < 32 and report.oracle[32].nll[0] == pytest.approx(full[first], rel=1e-4)
    assert [c["check"] for c in data["checks"]][:2] == [
        "sinks_within_5pct_of_recompute",
        "no_sinks_at_least_1.4x_sinks_after_slide",
    ]
    assert [(g["policy"], g["window"], g["sinks"]) for g in data["generation"]] == [
        ("full", None, 0),
        ("window", 16, 0),
        ("window", 16, 4),
    ]
    assert all(g["tokens"] == 40 and g["ppl_under_full"] > 0 for g in data["generation"])
    assert [d["checked"] for d in data["dialog"]] == [2, 2, 2]
    written = write_outputs(report, tmp_path)
    assert Path(written["plot"]).stat().st_size > 1000
    assert json.loads(Path(written["json"]).read_text())["results"] == json.loads(json.dumps(data["results"]))
    assert (tmp_path / "generation" / "window16-sinks4.txt").exists()
    assert "secret word" in (tmp_path / "dialog.md").read_text()


def test_full_context_is_capped_at_the_trained_length() -> None:
    assert full_policy(8192, 8192) == KVPolicy.full()
    capped = full_policy(8193, 8192)
    assert capped == KVPolicy.windowed(8188, sinks=4)  # in-cache positions stay below 8192


def _on_the_tiny_model(argv: list[str]) -> int:
    """``metronome eval quality`` as the CLI parses ``argv``, on the tiny model instead of ``--model``'s."""
    model = tiny_runner(tiny_hf(0))
    return eval_quality.run(build_parser().parse_args(argv), load=lambda name: (model, CharTokenizer()))


def test_cli_json_quick_on_the_tiny_model(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    argv = ["eval", "quality", "--quick", "--windows", "16", "--tokens", "200", "--slices", "4"]
    assert _on_the_tiny_model([*argv, "--gen-tokens", "30", "--out", str(tmp_path), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert set(data) >= {"text", "tokens", "results", "generation"}
    assert isinstance(data["text"], str) and data["tokens"] == 201
    for r in data["results"]:
        assert r["policy"] in ("full", "window", "recompute")
        assert r["window"] is None or isinstance(r["window"], int)
        assert isinstance(r["sinks"], int) and isinstance(r["ppl"], float)
        assert all(isinstance(x, float) for x in r["ppl_by_slice"])
    assert (tmp_path / "quality.png").exists()


def test_cli_prints_tables_and_rejects_bad_options(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    argv = ["eval", "quality", "--quick", "--windows", "16", "--tokens", "120", "--slices", "2", "--gen-tokens", "0"]
    assert _on_the_tiny_model([*argv, "--out", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "sinks*/recompute*" in out and "checks" in out and "dialog" in out
    with pytest.raises(ValueError, match="too few"):  # main() prints it as one line and exits 2
        _on_the_tiny_model(["eval", "quality", "--tokens", "3", "--slices", "4", "--out", str(tmp_path)])
    with pytest.raises(SystemExit):
        main(["eval", "quality", "--windows", "a,b"])


def test_oracle_positions_override_the_budget_and_each_slice_has_its_standard_error() -> None:
    model, tok = tiny_runner(tiny_hf(0)), CharTokenizer()
    cfg = QualityConfig.quick(
        tokens=240, windows=(16,), slices=4, oracle_positions=30, gen_tokens=0, gen_window=16, dialog_turns=0
    )
    assert cfg.positions_per_slice(16, 60) == 30 and cfg.positions_per_slice(16, 20) == 20
    report = run_quality(model, tok, tok.encode(TEXT), text="fox", text_sha256="0", config=cfg)
    assert [len(p) for p in report.oracle_positions[16]] == [30, 30, 30, 30]
    (check,) = [c for c in report.checks() if c["check"] == "sinks_within_5pct_of_recompute"]
    errors = check["log_ratio_stderr_by_slice"]
    assert len(errors) == 4 and all(e >= 0 for e in errors)
    # the error is of the paired differences: a stream that scores exactly as the oracle has none
    same = [0.0] * 240
    for i, v in zip([i for p in report.oracle_positions[16] for i in p], report.oracle[16].nll, strict=True):
        same[i] = v
    twin = replace(report.windowed[(16, 4)], nll=same)
    assert report.paired_stderr_by_slice(twin, 16) == [0.0] * 4


@pytest.mark.parametrize("bad", [0, -3])
def test_oracle_positions_must_be_positive(bad: int) -> None:
    with pytest.raises(ValueError, match="oracle_positions"):
        QualityConfig(oracle_positions=bad)
