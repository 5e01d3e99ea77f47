"""``kernels="auto"``: the path chosen by timing the candidates (kernels/choice.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from metronome_engine import KVPolicy, ModelConfig
from metronome_engine import engine as engine_module
from metronome_engine.kernels import choice
from metronome_engine.kernels.choice import REGIMES, KernelChoice, choose_kernels, pick

from .tiny import scripted_logits, tiny_engine

pytestmark = pytest.mark.usefixtures("one_torch_thread")

_TINY = ModelConfig(
    vocab_size=64, hidden_size=32, intermediate_size=48, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=16
)


def test_pick_takes_the_candidate_nearest_each_regimes_best() -> None:
    times = {
        "torch": {"decode_1": 10.0, "decode_32": 50.0, "prefill_64": 40.0},
        "fused-native": {"decode_1": 5.0, "decode_32": 60.0, "prefill_64": 20.0},
    }
    chosen, fastest = pick(times)
    assert chosen == "fused-native"  # worst ratio 1.2 (decode_32) against torch's 2.0 (decode_1, prefill)
    assert fastest == {"decode_1": "fused-native", "decode_32": "torch", "prefill_64": "fused-native"}
    times["fused-native"]["decode_32"] = 150.0  # now 3x torch's there
    assert pick(times)[0] == "torch"


def test_the_choice_is_timed_once_then_read_from_the_cache(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(choice, "_choice_dir", lambda build: tmp_path)
    first = choose_kernels(_TINY)
    assert set(first.times_ms) == {"torch", first.name} | ({"torch"} if first.path == "torch" else set())
    assert all(set(t) == set(REGIMES) for t in first.times_ms.values())
    assert first.times_ms[first.name] and first.fastest.keys() == REGIMES.keys()

    def no_timing(*args: object, **kwargs: object) -> None:
        raise AssertionError("timed again")

    monkeypatch.setattr(choice, "_measure", no_timing)
    again = choose_kernels(_TINY)
    assert again == first
    assert len(list(tmp_path.glob("choice-*.json"))) == 1


@pytest.mark.parametrize("prefill_on", ["torch", "fused-native"])
def test_an_auto_engine_that_switches_path_per_regime_keeps_exact_logits(
    monkeypatch: pytest.MonkeyPatch, prefill_on: str
) -> None:
    # where the measured winners differ per regime and no tiles pack the weights, "auto"
    # runs each step on its regime's winner: the logits must not notice the switches
    decode_on = "torch" if prefill_on != "torch" else "fused-native"
    measured = KernelChoice(
        "fused",
        "native",
        {},
        {"decode_1": decode_on, "decode_32": decode_on, "prefill_64": prefill_on},
        1,
    )
    monkeypatch.setattr(engine_module, "auto_choice", lambda config=None, model=None: measured)
    monkeypatch.setattr(engine_module, "resolve_kernels", lambda kernels, device, config=None, model=None: "fused")
    switching = tiny_engine(KVPolicy.windowed(12, sinks=4), kernels="auto")
    assert switching.regimes == {
        "decode_1": decode_on != "torch",
        "decode_32": decode_on != "torch",
        "prefill_64": prefill_on != "torch",
    }
    plain = tiny_engine(KVPolicy.windowed(12, sinks=4), kernels="torch")
    got, ref = scripted_logits(switching), scripted_logits(plain)
    assert float((got - ref).abs().max() / ref.abs().max()) < 1e-4
