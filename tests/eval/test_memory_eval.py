"""``eval memory``: the script, the report's shape, and the plumbing checked on the tiny random model."""

from __future__ import annotations

import json

import pytest

import metronome_bench.commands.eval_memory as eval_memory
from metronome_bench.eval.memory import FACTS, POLICIES, build_script, run_memory_eval
from metronome_sdk.cli import build_parser, main
from tests.engine.tiny import tiny_hf, tiny_runner

from .fakes import CharTokenizer

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_the_script_states_every_fact_once_and_asks_for_each() -> None:
    short, long = build_script(3, 0), build_script(3, 5)
    assert (short.system, short.turn1, short.questions) == (long.system, long.turn1, long.questions)
    assert len(long.fillers) == 5 and not short.fillers
    for name, where, question, _ in FACTS:
        expected = next(e for f, q, e in long.questions if f == name and q == question)
        assert expected in (long.system if where == "system" else long.turn1)
        assert all(expected not in u + a for u, a in long.fillers)  # no filler gives a fact away
    assert sorted(f for f, _, _ in long.questions) == sorted(n for n, *_ in FACTS)
    assert build_script(4, 5) != long  # another trial draws other facts or orders
    with pytest.raises(ValueError, match="n_filler"):
        build_script(0, -1)


def test_a_window_that_holds_everything_answers_as_full_does() -> None:
    """With W larger than any conversation, the three policies read the same tokens: same answers."""
    model, tok = tiny_runner(tiny_hf(0)), CharTokenizer()
    report = run_memory_eval(model, tok, fillers=(0, 2), trials=2, window=4096, sinks=4)
    by_policy = {
        p: [(a["n_filler"], a["trial"], a["fact"], a["answer"]) for a in report.answers if a["policy"] == p]
        for p in POLICIES
    }
    assert by_policy["full"] == by_policy["window"] == by_policy["pinned"]
    assert len(by_policy["full"]) == 2 * 2 * len(FACTS)
    for c in report.cells:
        assert 0.0 <= c.system_share <= 1.0 and 0.0 <= c.turn1_share <= 1.0 and c.trials == 2
    assert report.cell("full", 2).tokens_before_questions > report.cell("full", 0).tokens_before_questions
    assert all(check["pinned_within_noise_of_full"] for check in report.checks())


def _on_the_tiny_model(argv: list[str]) -> int:
    """``metronome eval memory`` as the CLI parses ``argv``, on the tiny model instead of ``--model``'s."""
    model = tiny_runner(tiny_hf(0))
    return eval_memory.run(build_parser().parse_args(argv), load=lambda name: (model, CharTokenizer()))


def test_a_small_window_changes_what_is_read(capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["eval", "memory", "--fillers", "0,3", "--trials", "2", "--window", "48", "--json"]
    assert _on_the_tiny_model(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert {(c["policy"], c["n_filler"]) for c in data["cells"]} == {(p, n) for p in POLICIES for n in (0, 3)}
    cell = data["cells"][0]
    assert set(cell["system"]) == {"share", "stderr", "trial_sd"} and cell["trials"] == 2
    assert [c["n_filler"] for c in data["checks"]] == [0, 3]
    answers = {(a["policy"], a["n_filler"], a["trial"], a["fact"]): a["answer"] for a in data["answers"]}
    # 48 tokens hold no whole conversation: the windowed sessions read other tokens than full
    assert any(answers[("window", 3, t, f)] != answers[("full", 3, t, f)] for t in (0, 1) for f, *_ in FACTS)
    assert data["window"] == 48 and data["filler_tokens"] > 0 and data["system_tokens"] > 0
    assert main(["eval", "memory", "--trials", "0"]) == 2
    with pytest.raises(SystemExit):
        main(["eval", "memory", "--fillers", "a"])
    _on_the_tiny_model(["eval", "memory", "--fillers", "1", "--trials", "1", "--window", "48"])  # the table
    assert "system facts" in capsys.readouterr().out
