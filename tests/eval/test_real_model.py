"""On the real SmolLM2 weights: `eval ppl --kv full` equals HF transformers, and the quick ablation holds."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
import torch

from metronome_sdk.cli import main

SHORT_TEXT = (
    "The lighthouse stood at the end of a long stone pier, and every evening the keeper climbed its "
    "spiral stairs to light the lamp. Ships passing in the night relied on its steady beam to find the "
    "harbor, and the fishermen of the village said that as long as the light burned, no boat would be "
    "lost to the rocks. One winter a storm came that lasted for eleven days. The waves broke over the "
    "pier, the wind tore slates from the roof of the keeper's cottage, and the supply boat could not "
    "reach the island. The keeper rationed his oil, trimmed the wick twice each night, and wrote in his "
    "logbook the names of every ship he saw. When the storm finally passed, the villagers rowed out to "
    "find him asleep at the foot of the stairs, the lamp still burning above him. "
)


@pytest.mark.real_model
def test_eval_ppl_full_equals_hf_transformers(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from transformers import LlamaForCausalLM

    import metronome_engine.weights
    from metronome_engine.tokenizer import Tokenizer

    text = tmp_path / "short.txt"
    text.write_text(SHORT_TEXT)
    assert main(["eval", "ppl", "--text", str(text), "--kv", "full", "--json"]) == 0
    ours = json.loads(capsys.readouterr().out)["ppl"]

    model_dir = metronome_engine.weights.resolve_model_dir("smollm2-135m-instruct")
    tokens = Tokenizer("smollm2-135m-instruct").encode(SHORT_TEXT)
    assert 150 <= len(tokens) <= 600  # a few hundred tokens
    hf = LlamaForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    with torch.no_grad():
        logits = hf(torch.tensor([tokens])).logits[0, :-1]
    nll = torch.nn.functional.cross_entropy(logits.double(), torch.tensor(tokens[1:]))
    theirs = math.exp(float(nll))
    assert abs(ours - theirs) / theirs < 1e-4


@pytest.mark.slow
@pytest.mark.real_model
@pytest.mark.timeout(900)
def test_quick_quality_keeps_the_issue_relations(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["eval", "quality", "--quick", "--json", "--out", str(tmp_path)]) == 0
    data = json.loads(capsys.readouterr().out)
    checks = {c["check"]: c for c in data["checks"] if c["window"] == 256}
    rows = {(r["policy"], r["sinks"]): r for r in data["results"] if r["window"] == 256}
    # sinks track the W-token oracle on the oracle's positions (quick scores 64 of them, too few
    # for 5% per slice, so the bound is on all of them together and looser)
    # slices hold equal numbers of positions, so the geometric mean of slice ppl is the ppl over all
    sinks_paired = _geomean(rows[("window", 4)]["paired_ppl_by_slice"])
    oracle = _geomean(rows[("recompute", 0)]["ppl_by_slice"])
    assert abs(sinks_paired / oracle - 1.0) < 0.2
    # without sinks, perplexity jumps once the window slides
    assert checks["no_sinks_at_least_1.4x_sinks_after_slide"]["ratio"] >= 1.4
    assert rows[("window", 0)]["ppl"] > rows[("window", 4)]["ppl"]
    assert len(data["generation"]) == 3 and (tmp_path / "quality.png").exists()


def _geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values))
