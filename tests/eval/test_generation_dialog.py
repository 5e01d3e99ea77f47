"""Free-running generation and the scripted dialog, on the tiny random model."""

from __future__ import annotations

import pytest

from metronome_bench.eval.dialog import SECRET_WORDS, DialogAnswer, run_dialog, turn_messages
from metronome_bench.eval.generation import free_run
from metronome_engine import KVPolicy, SamplingParams
from tests.engine.tiny import tiny_hf, tiny_runner

from .fakes import STOP, CharTokenizer


def test_same_seed_same_text_until_the_window_slides_and_no_banned_token() -> None:
    model = tiny_runner(tiny_hf(2))
    sampling = SamplingParams(temperature=1.0, seed=5)
    prompt = [5, 6, 7, 8]
    full = free_run(model, KVPolicy.full(), prompt, 60, sampling=sampling, banned={STOP, 9})
    again = free_run(model, KVPolicy.full(), prompt, 60, sampling=sampling, banned={STOP, 9})
    window = free_run(model, KVPolicy.windowed(16, sinks=0), prompt, 60, sampling=sampling, banned={STOP, 9})
    assert full == again and len(full) == 60
    assert STOP not in full and 9 not in full
    # the window holds all 16 tokens of prompt + output until the 13th output token is fed
    assert window[:13] == full[:13]
    assert window != full


def test_free_run_rejects_empty_prompts_and_lengths() -> None:
    model = tiny_runner(tiny_hf(2))
    with pytest.raises(ValueError, match="prompt is empty"):
        free_run(model, KVPolicy.full(), [], 5, sampling=SamplingParams())
    with pytest.raises(ValueError, match="n_tokens"):
        free_run(model, KVPolicy.full(), [1], 0, sampling=SamplingParams())


def test_dialog_script_and_check() -> None:
    turns = turn_messages(["one passage", "two passage"])
    assert [w for _, w, _ in turns] == ["falcon", "copper", "falcon"]
    assert [c for _, _, c in turns] == [True, True, False]  # the recall question is not scored
    assert "secret word is copper" in turns[1][0]
    assert DialogAnswer("q", "falcon", "The word is Falcon.", True).correct
    assert not DialogAnswer("q", "falcon", "copper", True).correct
    with pytest.raises(ValueError, match="passages"):
        turn_messages(["p"] * (len(SECRET_WORDS) + 1))


def test_dialog_runs_every_turn_in_one_session_past_the_window() -> None:
    model = tiny_runner(tiny_hf(3))
    run = run_dialog(model, CharTokenizer(), KVPolicy.windowed(32, sinks=4), ["alpha " * 10, "beta " * 10])
    assert len(run.answers) == 3
    assert run.tokens > 200  # far past the 32-token window
    assert run.score[1] == 2
