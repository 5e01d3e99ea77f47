"""``kernels="auto"``: the path chosen by timing the candidates (kernels/choice.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from metronome_engine import EngineCore, KVPolicy, ModelConfig, kernels
from metronome_engine.kernels.choice import REGIMES, KernelChoice, choose_kernels, nearest_regime, pick, regime_paths
from metronome_engine.model import LlamaModel

from .tiny import scripted_logits, tiny_engine, tiny_hf, tiny_runner

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


# shapes whose every dense weight has blocks of 32 (a GGUF-like model can have blocks)
_BLOCKY = ModelConfig(
    vocab_size=64, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=2, num_kv_heads=1, head_dim=32
)


@pytest.fixture
def choices(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The folder the measured choices are cached in (beside the kernel builds), fresh: the
    builds these tests run are loaded first, from the machine's own cache."""
    for isa in {kernels.default_isa(), *(["x86-64-v3"] if "x86-64-v3" in kernels.runnable_isas() else [])}:
        kernels.get_build(isa).available()
    monkeypatch.setenv("METRONOME_CACHE", str(tmp_path / "cache"))
    yield tmp_path / "cache" / "kernels"


def _no_timing(*args: object, **kwargs: object) -> EngineCore:
    raise AssertionError("timed again")  # what the timing would do first: make a candidate engine


def _candidates(blocks: bool) -> set[str]:
    """The candidates ``auto`` must time for a model with or without blocks, on this machine's
    default build, whichever kind of CPU it is: the column groups only with blocks and no tiles."""
    build = kernels.get_build()
    fused = f"fused-{build.isa}"
    return {"torch", fused} | ({fused + "-groups"} if blocks and not build.tiles_available() else set())


def test_the_choice_is_timed_once_then_read_from_the_cache(choices: Path) -> None:
    first = choose_kernels(_BLOCKY, make_engine=EngineCore)
    assert set(first.times_ms) == _candidates(blocks=True) and first.dropped == {}
    assert first.name in first.times_ms and first.blocks
    assert all(set(t) == set(REGIMES) for t in first.times_ms.values())
    assert first.fastest.keys() == REGIMES.keys()

    again = choose_kernels(_BLOCKY, make_engine=_no_timing)
    assert again == first
    assert len(list(choices.glob("choice-*.json"))) == 1


def test_a_model_without_blocks_is_timed_without_the_paths_that_read_them(choices: Path) -> None:
    made = choose_kernels(_BLOCKY, blocks=False, make_engine=EngineCore)
    assert set(made.times_ms) == _candidates(blocks=False) and not made.blocks and made.dropped == {}
    assert not made.groups and made.name in made.times_ms
    assert len(list(choices.glob("choice-*.json"))) == 1  # its own entry: the key knows the blocks
    assert choose_kernels(_BLOCKY, blocks=False, make_engine=_no_timing) == made


@pytest.mark.usefixtures("choices")
def test_a_candidate_that_cannot_run_the_model_is_left_out_not_chosen() -> None:
    # _TINY's down projection (K = 48) has no blocks of 32: the column groups cannot hold it
    made = choose_kernels(_TINY, make_engine=EngineCore)
    assert set(made.times_ms) == _candidates(blocks=False)
    groups = _candidates(blocks=True) - _candidates(blocks=False)
    assert set(made.dropped) == groups and not made.groups
    for reason in made.dropped.values():
        assert "no blocks that are its weights" in reason
    assert all(not name.endswith("-groups") for name in made.fastest.values())


def _measured_as(folder: Path, model: LlamaModel, fastest: dict[str, str], isa: kernels.Isa | None = None) -> None:
    """Time the choice for ``model`` as "auto" does, then make the cached choice (its file in
    ``folder``) say that ``fastest`` won each regime: what an "auto" engine then runs."""
    build = kernels.get_build(isa)
    choose_kernels(model.config, build.isa, blocks=model.has_blocks, make_engine=EngineCore)
    (path,) = folder.glob("choice-*.json")
    cached = json.loads(path.read_text())
    cached.update(path="fused", isa=build.isa, fastest=fastest)
    path.write_text(json.dumps(cached))


@pytest.mark.parametrize("prefill_on", ["torch", "fused"])
def test_an_auto_engine_that_switches_path_per_regime_keeps_exact_logits(choices: Path, prefill_on: str) -> None:
    # where the measured winners differ per regime and no tiles pack the weights, "auto"
    # runs each step on its regime's winner: the logits must not notice the switches
    fused = f"fused-{kernels.default_isa()}"
    prefill = fused if prefill_on == "fused" else "torch"
    decode = "torch" if prefill != "torch" else fused
    model = tiny_runner(tiny_hf(0))
    _measured_as(choices, model, {"decode_1": decode, "decode_8": decode, "decode_32": decode, "prefill_64": prefill})
    switching = EngineCore(model, policy=KVPolicy.windowed(12, sinks=4), num_blocks=256, block_size=4)
    to_path = {"torch": "torch", fused: "fused"}
    assert switching.regimes == {
        "decode_1": to_path[decode],
        "decode_8": to_path[decode],
        "decode_32": to_path[decode],
        "prefill_64": to_path[prefill],
    }
    plain = tiny_engine(KVPolicy.windowed(12, sinks=4), kernels="torch")
    got, ref = scripted_logits(switching), scripted_logits(plain)
    assert float((got - ref).abs().max() / ref.abs().max()) < 1e-4


def test_a_step_takes_the_regime_nearest_it() -> None:
    assert nearest_regime(1, 1) == nearest_regime(2, 1) == "decode_1"
    assert nearest_regime(3, 1) == nearest_regime(8, 1) == nearest_regime(16, 1) == "decode_8"
    assert nearest_regime(17, 1) == nearest_regime(100, 1) == "decode_32"
    assert nearest_regime(1, 2) == nearest_regime(32, 64) == "prefill_64"


def test_regime_paths_leave_out_the_groups_where_the_model_has_no_blocks() -> None:
    times = {
        "torch": {"decode_1": 10.0, "decode_8": 30.0, "prefill_64": 40.0},
        "fused-x86-64-v3": {"decode_1": 9.0, "decode_8": 20.0, "prefill_64": 30.0},
        "fused-x86-64-v3-groups": {"decode_1": 4.0, "decode_8": 10.0, "prefill_64": 35.0},
    }
    chosen, fastest = pick(times)
    made = KernelChoice("fused", "x86-64-v3", times, fastest, 2, chosen.endswith("-groups"))
    assert made.name == chosen == "fused-x86-64-v3-groups"
    assert regime_paths(made, groups=True) == {"decode_1": "groups", "decode_8": "groups", "prefill_64": "fused"}
    assert regime_paths(made, groups=False) == {"decode_1": "fused", "decode_8": "fused", "prefill_64": "fused"}
    untimed = KernelChoice("fused", "x86-64-v3", {}, {"decode_1": "fused-x86-64-v3-groups"}, 2, True)
    assert regime_paths(untimed, groups=False) == {"decode_1": "fused"}


def test_an_auto_engine_on_a_gguf_like_model_reads_the_groups_where_they_won(choices: Path) -> None:
    from .test_tiles import _block_model

    if "x86-64-v3" not in kernels.runnable_isas():
        pytest.skip("the x86-64-v3 build (no tiles) runs on x86-64 CPUs with AVX2 only")
    model, _ = _block_model()
    fastest = {
        "decode_1": "fused-x86-64-v3-groups",
        "decode_8": "fused-x86-64-v3-groups",
        "decode_32": "torch",
        "prefill_64": "fused-x86-64-v3",
    }
    _measured_as(choices, model, fastest, "x86-64-v3")
    policy = KVPolicy.windowed(12, sinks=4)
    switching = EngineCore(model, policy=policy, num_blocks=96, block_size=4, isa="x86-64-v3")
    assert switching.regimes == {
        "decode_1": "groups",
        "decode_8": "groups",
        "decode_32": "torch",
        "prefill_64": "fused",
    }
    assert model.grouped and not model.packed
    plain = EngineCore(_block_model()[0], policy=policy, num_blocks=96, block_size=4, kernels="torch")
    got, ref = scripted_logits(switching), scripted_logits(plain)
    assert float((got - ref).abs().max() / ref.abs().max()) < 1e-4
