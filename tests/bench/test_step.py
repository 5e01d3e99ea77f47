"""``metronome bench step``: interleaved timing, the roofline's cost model, and the command on the real model."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from metronome_bench.roofline import Roofline, RooflineProbe, decode_step_cost, measure_roofline
from metronome_bench.step import contexts_for, interleaved_medians
from metronome_engine import ModelConfig


def test_steppers_take_their_steps_in_turn_after_one_warm_up_each() -> None:
    calls: list[str] = []
    medians = interleaved_medians([lambda: calls.append("engine"), lambda: calls.append("hf")], steps=3)
    assert calls == ["engine", "hf"] * 4  # a warm-up each, then three rounds
    assert len(medians) == 2 and all(m >= 0 for m in medians)


def test_contexts_spread_over_the_range_the_same_for_both_engines() -> None:
    ctx = contexts_for(32)
    assert len(ctx) == 32 and min(ctx) == 128 and max(ctx) < 272
    assert ctx == sorted(ctx) and contexts_for(1) == [128]


def test_the_probe_turns_its_two_times_into_the_roofline_rates() -> None:
    probe = RooflineProbe()
    roof = probe.roofline(gemm_s=0.5, copy_s=0.25)
    assert roof.gemm_gflops == pytest.approx(2 * 2048**3 / 0.5 / 1e9)
    assert roof.copy_gbs == pytest.approx(2 * 256 * 2**20 / 0.25 / 1e9)  # read + write of 256 MB
    peak = measure_roofline(repeats=1, probe=probe)
    assert peak.gemm_gflops > 0 and peak.copy_gbs > 0


def test_decode_cost_counts_every_weight_once_and_each_sessions_kv() -> None:
    c = ModelConfig(
        vocab_size=100,
        hidden_size=8,
        intermediate_size=16,
        num_layers=2,
        num_heads=2,
        num_kv_heads=1,
        head_dim=4,
    )
    weights = 2 * (8 * (8 + 2 * 4) + 8 * 8 + 3 * 8 * 16) + 100 * 8
    flops, moved = decode_step_cost(c, [3, 5])
    assert flops == 2.0 * weights * 2 + sum(4 * (n + 1) * 8 * 2 for n in (3, 5))
    assert moved == 4.0 * weights + (4 + 6) * c.kv_bytes_per_token(4)
    # the floor is the slower of compute and memory
    roof = Roofline(gemm_gflops=1.0, copy_gbs=1.0)
    assert roof.floor_ms(flops, moved) == max(flops, moved) / 1e9 * 1e3


@pytest.mark.real_model
@pytest.mark.timeout(600)
def test_bench_step_json_beside_hf_and_the_floor() -> None:
    cmd = [sys.executable, "-m", "metronome_sdk.cli", "bench", "step", "--batch", "1,2", "--steps", "2", "--json"]
    cmd += ["--prefill", "64"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=580, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert [b["batch"] for b in report["batches"]] == [1, 2]
    for b in report["batches"]:
        assert b["engine_ms"] > 0 and b["hf_ms"] > 0 and b["floor_ms"] > 0
        assert b["engine_vs_hf"] == pytest.approx(b["engine_ms"] / b["hf_ms"])
        assert b["engine_vs_floor"] == pytest.approx(b["engine_ms"] / b["floor_ms"])
        # the floor measured in turn with the steps, and the peak measured before
        assert b["floor_peak_ms"] > 0 and b["gemm_gflops"] > 0 and b["copy_gbs"] > 0
        assert b["engine_vs_floor_peak"] == pytest.approx(b["engine_ms"] / b["floor_peak_ms"])
        assert b["honest_floor_ms"] > 0 and b["read_gbs"] > 0
    assert report["gemm_gflops"] > 0 and report["copy_gbs"] > 0
    # "auto" says what it chose and the times it chose from; the run is that path
    auto = report["auto"]
    assert auto["chosen"] in auto["times_ms"] and set(auto["fastest"]) == {
        "decode_1",
        "decode_8",
        "decode_32",
        "prefill_64",
    }
    assert report["kernels"] == auto["path"] and report["isa"] == auto["isa"]
    assert report["weights"] in ("tiles", "float32", "float32+groups")
    for b in report["batches"]:  # the torch path timed beside a fused engine
        assert (b["torch_ms"] is not None) == (report["kernels"] == "fused")
    [pre] = report["prefill"]
    assert pre["chunk"] == 64 and pre["context"] == 256 and pre["engine_ms"] > 0 and pre["hf_ms"] > 0
    assert pre["engine_tokens_per_s"] == pytest.approx(64e3 / pre["engine_ms"])


@pytest.mark.real_model
@pytest.mark.timeout(600)
@pytest.mark.parametrize(("isa", "capability"), [("x86-64-v3", "AVX2"), ("x86-64-v4", "AVX512")])
def test_bench_step_on_an_x86_64_level_holds_every_library_to_it(isa: str, capability: str) -> None:
    from metronome_engine import cpu, kernels

    why = kernels.cannot_run(isa)  # type: ignore[arg-type]
    if why is not None:
        pytest.skip(why)
    cmd = [sys.executable, "-m", "metronome_sdk.cli", "bench", "step", "--batch", "2", "--steps", "1", "--no-hf"]
    cmd += ["--isa", isa, "--kernels", "fused", "--prefill", "", "--json"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=580, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert report["isa"] == isa and report["machine"]["torch_cpu_capability"] == capability
    # the figure names its CPU and its build
    assert report["machine"]["cpu"] == cpu.model_name() and report["machine"]["build"] == isa
    assert report["machine"]["vector_flags"] == cpu.vector_flags()
    assert report["kernels"] == "fused" and report["weights"] == "float32"  # no tiles in these builds
    assert report["batches"][0]["engine_ms"] > 0 and report["batches"][0]["torch_ms"] > 0


@pytest.mark.real_model
@pytest.mark.timeout(600)
def test_bench_step_on_the_torch_path_says_so() -> None:
    cmd = [sys.executable, "-m", "metronome_sdk.cli", "bench", "step", "--batch", "2", "--steps", "1", "--no-hf"]
    done = subprocess.run([*cmd, "--kernels", "torch", "--json"], capture_output=True, text=True, timeout=580)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout)
    assert report["kernels"] == "torch" and report["weights"] == "float32"
    assert report["batches"][0]["engine_ms"] > 0
    assert "in turn" in done.stderr  # the progress says how it was timed


def test_bench_step_refuses_the_x86_64_v3_build_on_aarch64(monkeypatch: pytest.MonkeyPatch) -> None:
    # a clear error before anything is built or timed, not a compiler's or a quiet torch run
    from metronome_bench.commands._common import select_isa
    from metronome_engine import kernels
    from metronome_engine.cpu import CpuInfo

    monkeypatch.delenv(kernels.ISA_ENV, raising=False)
    with pytest.raises(
        ValueError, match="--isa x86-64-v3: the x86-64-v3 build needs an x86-64 CPU, this one is aarch64"
    ):
        select_isa("x86-64-v3", CpuInfo("aarch64"))
    assert kernels.ISA_ENV not in os.environ
