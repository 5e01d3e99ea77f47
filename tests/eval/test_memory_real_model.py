"""``eval memory --quick`` on the real SmolLM2 weights: the issue's relation between the policies."""

from __future__ import annotations

import json

import pytest

from metronome_sdk.cli import main


@pytest.mark.slow
@pytest.mark.real_model
@pytest.mark.timeout(900)
def test_quick_memory_eval_pinned_prompt_is_kept(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval", "memory", "--quick", "--threads", "1", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    cells = {(c["policy"], c["n_filler"]): c for c in data["cells"]}
    answers = {(a["policy"], a["n_filler"], a["trial"], a["fact"]): a["answer"] for a in data["answers"]}
    # N = 0: the whole conversation fits in the window, so every policy reads the same tokens
    zero = [k[1:] for k in answers if k[0] == "full" and k[1] == 0]
    assert all(answers[("full", *k)] == answers[("window", *k)] == answers[("pinned", *k)] for k in zero)
    # once the window slid past the prompt, pinning keeps at least what the plain window keeps
    for check in data["checks"]:
        assert check["pinned_at_least_window"]
    n = max(c["n_filler"] for c in data["cells"])
    assert cells[("pinned", n)]["tokens_before_questions"] > data["window"] + data["sinks"]
