"""``bench step``'s anchors: parsing llama-batched-bench, the flags, and absent anchors' reasons.

llama.cpp and vLLM are stood in for here (a script printing llama-batched-bench's output, a
fake worker); the command's end-to-end run on both is in docs/engine.md.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from metronome_bench import anchors as anchors_mod
from metronome_bench.anchors import (
    AnchorFailed,
    Anchors,
    LlamaBench,
    LlamaRow,
    VLLMAnchor,
    find_vllm_python,
    make_anchors,
    parse_batched_bench,
)
from metronome_bench.step import PrefillResult, StepResult
from metronome_sdk.cli import build_parser

# llama-batched-bench's markdown output, as it printed it here (its settings line, then the table)
TABLE = """
llama_batched_bench: n_kv_max = 16384, n_batch = 2048, n_ubatch = 512, flash_attn = -1, n_threads = 2

|    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s |      T s |    S t/s |
|-------|--------|------|--------|----------|----------|----------|----------|----------|----------|
|    64 |      4 |    1 |     68 |    1.692 |    37.82 |    0.353 |    11.33 |    2.045 |    33.25 |
|    64 |      4 |    2 |    136 |    3.514 |    36.43 |    0.927 |     8.63 |    4.441 |    30.62 |
"""


def _jsonl(pp: int, tg: int, pl: int, t_pp: float, t_tg: float) -> str:
    return json.dumps(
        {"n_kv_max": 16384, "n_threads": 2, "pp": pp, "tg": tg, "pl": pl, "n_kv": pl * (pp + tg), "t_pp": t_pp,
         "speed_pp": pl * pp / t_pp, "t_tg": t_tg, "speed_tg": pl * tg / t_tg, "t": t_pp + t_tg, "speed": 1.0}
    )  # fmt: skip


def test_the_markdown_table_gives_one_row_per_sequence_count() -> None:
    rows = parse_batched_bench(TABLE)
    assert [r.sequences for r in rows] == [1, 2]
    assert rows[0] == LlamaRow(64, 4, 1, 1.692, 37.82, 0.353, 11.33)
    assert rows[1].step_ms == pytest.approx(1e3 * 0.927 / 4)  # ms per decode step: T_TG over TG


def test_the_json_lines_give_the_same_rows_and_the_step_time() -> None:
    text = "some log line\n" + _jsonl(200, 32, 8, 4.0, 1.6) + "\n" + _jsonl(200, 32, 32, 16.0, 4.48) + "\n"
    rows = parse_batched_bench(text)
    assert [(r.prompt, r.generated, r.sequences) for r in rows] == [(200, 32, 8), (200, 32, 32)]
    assert rows[0].step_ms == pytest.approx(50.0) and rows[1].step_ms == pytest.approx(140.0)
    assert rows[1].prefill_tokens_per_s == pytest.approx(32 * 200 / 16.0)
    assert rows[1].as_dict()["step_ms"] == pytest.approx(140.0)


def test_a_row_that_does_not_parse_is_an_error_not_a_figure() -> None:
    with pytest.raises(ValueError, match="does not parse"):
        parse_batched_bench("|    64 |      4 |    1 |     68 |    n/a | 37.82 | 0.353 | 11.33 | 2.045 | 33.25 |")
    with pytest.raises(ValueError, match="no decode steps"):
        parse_batched_bench(_jsonl(64, 0, 1, 1.0, 1.0))
    assert parse_batched_bench("no table here\n") == []


def _script(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "llama-batched-bench"
    path.write_text("#!/bin/sh\n" + body)
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return path


def test_llama_bench_runs_the_binary_with_the_engines_threads_and_parses_it(tmp_path: Path) -> None:
    out = tmp_path / "out.jsonl"
    out.write_text(_jsonl(200, 32, 1, 0.6, 0.32) + "\n")
    args = tmp_path / "args"
    binary = _script(tmp_path, f'echo "$@" > {args}\ncat {out}\necho "llama log" >&2\n')
    bench = LlamaBench(binary, tmp_path / "m.gguf", threads=3, extra=("--no-repack",))
    rows = bench.run([1], prompt=200, generated=32)
    assert rows[0].step_ms == pytest.approx(10.0)
    argv = args.read_text().split()
    assert argv[argv.index("-t") + 1] == "3" and argv[argv.index("-npl") + 1] == "1"
    assert argv[argv.index("-m") + 1] == str(tmp_path / "m.gguf")
    assert argv[argv.index("-npp") + 1] == "200" and argv[argv.index("-ntg") + 1] == "32"
    assert argv[-1] == "--no-repack"


def test_a_crashing_or_short_llama_bench_raises_with_its_output(tmp_path: Path) -> None:
    crash = LlamaBench(_script(tmp_path, 'echo "ggml_backend_amx_mul_mat: abort" >&2\nexit 134\n'), tmp_path, 2)
    with pytest.raises(AnchorFailed, match=r"exited 134 with 0 rows:\n.*amx_mul_mat"):
        crash.run([1], 200, 32)
    (tmp_path / "one").write_text(_jsonl(200, 32, 1, 0.6, 0.32))
    short = LlamaBench(_script(tmp_path, f"cat {tmp_path / 'one'}\n"), tmp_path, 2)
    with pytest.raises(AnchorFailed, match="with 1 rows"):
        short.run([1, 8], 200, 32)  # two sequence counts asked, one row back
    with pytest.raises(AnchorFailed, match="No such file"):
        LlamaBench(tmp_path / "absent", tmp_path, 2).run([1], 200, 32)


def test_anchors_keep_a_failed_llama_as_its_reason_and_stop_running_it(tmp_path: Path) -> None:
    anchors = Anchors(llama=LlamaBench(_script(tmp_path, "exit 1\n"), tmp_path, 2))
    assert anchors.llama_rows("decode 1", [1]) is None
    assert "exited 1" in anchors.missing["llama.cpp"] and anchors.llama is None
    assert anchors.llama_rows("decode 8", [8]) is None  # not run again
    assert anchors.as_dict()["llama.cpp"] is None and anchors.as_dict()["when"] == []


def test_anchors_log_when_llama_ran_and_use_the_issue_s_prompt(tmp_path: Path) -> None:
    (tmp_path / "one").write_text(_jsonl(200, 32, 8, 4.0, 1.6))
    args = tmp_path / "args"
    anchors = Anchors(llama=LlamaBench(_script(tmp_path, f'echo "$@" > {args}\ncat {tmp_path / "one"}\n'), tmp_path, 2))
    rows = anchors.llama_rows("decode 8", [8])
    assert rows is not None and rows[0].step_ms == pytest.approx(50.0)
    argv = args.read_text().split()
    assert argv[argv.index("-npp") + 1] == "200" and argv[argv.index("-ntg") + 1] == "32"
    (when,) = anchors.as_dict()["when"]
    assert when["anchor"] == "llama.cpp" and when["what"] == "decode 8" and not when["in_turn"]
    assert when["start"] <= when["end"] and when["start"].endswith("+00:00")


def test_every_absent_anchor_says_why(tmp_path: Path) -> None:
    none = make_anchors("smollm2-135m-instruct", llama_bench=None, vllm_python=None, with_vllm=False,
                        threads=2, max_batch=1, max_context=300)  # fmt: skip
    assert none.llama is None and none.vllm is None
    assert "--llama-bench" in none.missing["llama.cpp"] and "--no-vllm" in none.missing["vllm-cpu"]
    plain = tmp_path / "not-executable"
    plain.write_text("")
    bad = make_anchors("smollm2-135m-instruct", llama_bench=str(plain), vllm_python=str(tmp_path / "python"),
                       with_vllm=True, threads=2, max_batch=1, max_context=300)  # fmt: skip
    assert "not an executable" in bad.missing["llama.cpp"] and "is not a file" in bad.missing["vllm-cpu"]
    folder = tmp_path / "hf-folder"
    folder.mkdir()
    no_gguf = make_anchors(str(folder), llama_bench=str(_script(tmp_path, "exit 0\n")), vllm_python=None,
                           with_vllm=False, threads=2, max_batch=1, max_context=300)  # fmt: skip
    assert "no GGUF file" in no_gguf.missing["llama.cpp"]


def test_llama_runs_on_the_gguf_the_engine_loads_with_its_threads(tmp_path: Path) -> None:
    from metronome_engine.weights import smollm2_gguf_path

    made = make_anchors("smollm2-135m-instruct", llama_bench=str(_script(tmp_path, "exit 0\n")),
                        llama_args="--no-repack --poll 0", vllm_python=None, with_vllm=False,
                        threads=5, max_batch=1, max_context=300)  # fmt: skip
    assert made.llama is not None and "llama.cpp" not in made.missing
    assert made.llama.gguf == smollm2_gguf_path() and made.llama.threads == 5
    assert made.llama.extra == ("--no-repack", "--poll", "0")


def test_the_vllm_venv_is_found_at_the_source_tree_or_given(tmp_path: Path) -> None:
    import metronome_engine

    python = tmp_path / "python"
    python.write_text("")
    assert find_vllm_python(str(python)) == python
    # a source tree: .venv-vllm at its root; by default the tree this engine was imported from
    reason = find_vllm_python(None, tmp_path)
    assert isinstance(reason, str) and "make .venv-vllm/.installed" in reason
    venv = tmp_path / ".venv-vllm/bin/python"
    venv.parent.mkdir(parents=True)
    venv.write_text("")
    assert find_vllm_python(None, tmp_path) == venv
    here = Path(metronome_engine.__file__).resolve().parents[2] / ".venv-vllm" / "bin" / "python"
    found = find_vllm_python(None)
    assert found == here if here.is_file() else str(here) in str(found)


class _FakeWorker:
    """Stands in for the vLLM backend's subprocess driver: answers as ``serve_ticks`` does."""

    def __init__(self, spec: dict[str, Any], pythonpath: str | None, python: str | None = None,
                 env_extra: dict[str, str] | None = None) -> None:  # fmt: skip
        self.spec, self.python, self.env = spec, python, env_extra
        self.asked: list[str] = []
        self.closed = False

    def ask(self, command: str | None) -> str:
        assert command is not None
        self.asked.append(command)
        return "0.025" if command.startswith("tick") else "done"

    def close(self) -> None:
        self.closed = True


def test_vllm_steps_open_the_engines_contexts_and_return_vllms_own_time() -> None:
    made: list[_FakeWorker] = []

    def make_worker(*args: Any) -> _FakeWorker:
        made.append(_FakeWorker(*args))
        return made[-1]

    anchor = VLLMAnchor(
        Path("/venv/bin/python"), "smollm2-135m-instruct", max_batch=8, max_context=290, make_worker=make_worker
    )
    (worker,) = made
    assert worker.python == "/venv/bin/python" and worker.env == {"VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
    assert worker.spec["policy"] == "full" and worker.spec["dtype"] == "float32" and worker.spec["frame"] == 1
    # the pool holds every session at the longest context, in blocks of 32
    assert worker.spec["max_model_len"] >= 290 and worker.spec["num_blocks"] >= 8 * 290 // 32
    step = anchor.decode_stepper([128, 200])
    assert step() == pytest.approx(25.0) and step() == pytest.approx(25.0)
    assert worker.asked == ["open-contexts 128,200", "tick 1", "tick 2"]
    pre = anchor.prefill_stepper(64, 256)
    assert worker.asked[-1] == "free"  # the decode sessions are let go first
    del worker.asked[:]
    assert pre() == pytest.approx(25.0)
    assert worker.asked == ["open-contexts 192", "tick 3 64", "free"]
    anchors = Anchors(vllm=anchor)
    assert len(anchors.decode_steppers(1, [128])) == 1 and anchors.log[-1]["in_turn"]
    assert anchors.as_dict()["vllm-cpu"]["env"] == {"VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
    anchors.close()
    assert worker.closed


def test_the_step_rows_carry_the_anchors_and_the_ratios_against_them() -> None:
    row = StepResult(8, 40.0, 80.0, 20.0, 128, 254, 20.0, 100.0, 10.0, 20.0, 10.0, llama_ms=50.0, vllm_ms=80.0)
    d = row.as_dict()
    assert d["engine_vs_llama"] == pytest.approx(0.8) and d["engine_vs_vllm"] == pytest.approx(0.5)
    absent = StepResult(8, 40.0, 80.0, 20.0, 128, 254, 20.0, 100.0, 10.0, 20.0, 10.0).as_dict()
    assert absent["llama_ms"] is None and absent["engine_vs_llama"] is None and absent["engine_vs_vllm"] is None
    pre = PrefillResult(64, 256, 100.0, 120.0, llama_tokens_per_s=320.0, vllm_ms=200.0).as_dict()
    assert pre["engine_tokens_per_s"] == pytest.approx(640.0) and pre["vllm_tokens_per_s"] == pytest.approx(320.0)
    assert pre["engine_vs_llama"] == pytest.approx(0.5)  # time per token: 1/640 against 1/320
    assert pre["engine_vs_vllm"] == pytest.approx(0.5)  # the prefill table's vLLM column reads it
    assert PrefillResult(64, 256, 100.0, 120.0).as_dict()["engine_vs_vllm"] is None


def test_the_anchor_flags_and_their_environment_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(anchors_mod.LLAMA_BENCH_ENV, raising=False)
    monkeypatch.delenv(anchors_mod.VLLM_PYTHON_ENV, raising=False)
    monkeypatch.delenv("METRONOME_LLAMA_ARGS", raising=False)
    args = build_parser().parse_args(["bench", "step"])
    assert args.llama_bench is None and args.vllm_python is None and not args.no_vllm and args.llama_args == ""
    monkeypatch.setenv(anchors_mod.LLAMA_BENCH_ENV, "/opt/llama-batched-bench")
    monkeypatch.setenv(anchors_mod.VLLM_PYTHON_ENV, "/opt/venv/bin/python")
    args = build_parser().parse_args(["bench", "step", "--llama-args=--no-repack", "--no-vllm"])
    assert args.llama_bench == "/opt/llama-batched-bench" and args.vllm_python == "/opt/venv/bin/python"
    assert args.llama_args == "--no-repack" and args.no_vllm
    monkeypatch.setenv("METRONOME_LLAMA_ARGS", "--no-repack --poll 0")
    assert build_parser().parse_args(["bench", "step"]).llama_args == "--no-repack --poll 0"
    args = build_parser().parse_args(["bench", "step", "--llama-bench", "/x/bench", "--vllm-python", "/y/python"])
    assert args.llama_bench == "/x/bench" and args.vllm_python == "/y/python"


def test_the_table_says_why_an_anchor_has_no_column(capsys: pytest.CaptureFixture[str]) -> None:
    from metronome_bench.commands.bench_step import _print_anchor_notes

    _print_anchor_notes(Anchors(missing={"vllm-cpu": "no .venv-vllm/bin/python"}).as_dict())
    out = capsys.readouterr().out
    assert "no vllm-cpu anchor: no .venv-vllm/bin/python" in out and "llama.cpp" not in out


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_real_llama_batched_bench_parses_on_the_engines_gguf() -> None:
    """Where a llama-batched-bench is at hand ($METRONOME_LLAMA_BENCH; not a CI dependency)."""
    from metronome_engine.weights import smollm2_gguf_path

    binary = os.environ.get(anchors_mod.LLAMA_BENCH_ENV)
    if not binary:
        pytest.skip(f"no {anchors_mod.LLAMA_BENCH_ENV}: llama.cpp is not built here")
    extra = tuple(os.environ.get("METRONOME_LLAMA_ARGS", "").split())
    rows = LlamaBench(Path(binary), smollm2_gguf_path(), threads=2, extra=extra).run([1, 2], prompt=32, generated=2)
    assert [(r.prompt, r.generated, r.sequences) for r in rows] == [(32, 2, 1), (32, 2, 2)]
    assert all(r.step_ms > 0 and r.prefill_tokens_per_s > 0 for r in rows)
    # its own figures agree with each other: tokens per second is sequences x steps over the time
    assert rows[1].decode_tokens_per_s == pytest.approx(2 * 2 / rows[1].decode_s, rel=0.01)
