"""The public surface: re-exports, the exception tree, and configuration checked when made."""

from __future__ import annotations

import importlib
import pkgutil
import re
from pathlib import Path

import anyio
import pytest

import metronome_sdk as metronome
from metronome_sdk import _exceptions

TREE_LINE = re.compile(r"^[\s│├└─]*(\w+)\s")


def test_all_is_sorted_and_matches_the_private_modules() -> None:
    assert metronome.__all__ == sorted(metronome.__all__)
    assert len(set(metronome.__all__)) == len(metronome.__all__)
    for name in metronome.__all__:
        assert getattr(metronome, name) is not None
    exported = set()
    for info in pkgutil.iter_modules(metronome.__path__):
        if info.name.startswith("_") and info.name != "_log":
            module = importlib.import_module(f"metronome_sdk.{info.name}")
            exported |= set(getattr(module, "__all__", ()))
    assert exported | {"SamplingParams"} == set(metronome.__all__)


def parse_tree(text: str) -> dict[str, str | None]:
    """``{class: parent}`` from the tree drawn in a docstring or a page."""
    root = re.search(r"^\s*MetronomeError\s*$", text, re.MULTILINE)
    assert root is not None, "no tree rooted at MetronomeError"
    block = text[root.start() :].strip("\n").split("\n\n")[0].split("```")[0]
    parents: dict[str, str | None] = {}
    stack: list[tuple[int, str]] = []
    for line in block.splitlines():
        m = TREE_LINE.match(line + " ")
        if not m:
            continue
        depth = len(line) - len(line.lstrip(" │├└─"))
        while stack and stack[-1][0] >= depth:
            stack.pop()
        parents[m.group(1)] = stack[-1][1] if stack else None
        stack.append((depth, m.group(1)))
    return parents


def test_the_exception_tree_in_the_docstring_is_the_real_one() -> None:
    tree = parse_tree(_exceptions.__doc__ or "")
    assert len(tree) == 15
    errors = {n for n in _exceptions.__all__ if issubclass(getattr(_exceptions, n), BaseException)}
    assert set(tree) == errors and set(_exceptions.__all__) - errors == {"StallReason"}
    for name, parent in tree.items():
        cls = getattr(metronome, name)
        expected = getattr(metronome, parent) if parent else Exception
        assert cls.__bases__[0] is expected, name
    assert issubclass(metronome.DeadlineMissed, TimeoutError)


def test_docs_draw_the_same_tree() -> None:
    page = Path(__file__).parents[2] / "docs" / "exceptions.md"
    assert parse_tree(page.read_text()) == parse_tree(_exceptions.__doc__ or "")


def test_overloaded_carries_retry_after_limit_and_in_flight() -> None:
    err = metronome.AdmissionRejected("full", retry_after=0.5, limit=8, in_flight=8)
    assert (err.retry_after, err.limit, err.in_flight) == (0.5, 8, 8)
    assert isinstance(err, metronome.Overloaded) and isinstance(err, metronome.MetronomeError)
    broken = metronome.SessionBroken("peer gone", session_id=3)
    assert isinstance(broken, metronome.SessionError) and broken.session_id == 3


def test_a_full_input_queue_carries_only_retry_after_and_every_error_a_session_id() -> None:
    full = metronome.InputQueueFull("full", retry_after=0.08, session_id=2)
    assert isinstance(full, metronome.Overloaded) and full.retry_after == 0.08
    assert not hasattr(full, "limit") and not hasattr(full, "in_flight")
    assert metronome.MetronomeError("x").session_id is None
    assert metronome.EngineClosed("closed", session_id=4).session_id == 4
    stalled = metronome.EngineStalled("full", reason="pool_exhausted")  # type: ignore[arg-type]
    assert stalled.reason is metronome.StallReason.POOL_EXHAUSTED and stalled.reason == "pool_exhausted"
    with pytest.raises(ValueError):
        metronome.EngineStalled("?", reason="a free string")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: metronome.EngineConfig(kv="paged"), "kv"),  # type: ignore[arg-type]
        (lambda: metronome.EngineConfig(window=0), "window"),
        (lambda: metronome.EngineConfig(sinks=-1), "sinks"),
        (lambda: metronome.EngineConfig(num_blocks=8, memory_bytes=1 << 20), "not both"),
        (lambda: metronome.EngineConfig(num_blocks=0), "num_blocks"),
        (lambda: metronome.EngineConfig(block_size=0), "block_size"),
        (lambda: metronome.EngineConfig(model=""), "model"),
        (lambda: metronome.EngineConfig(threads=0), "threads"),
        (lambda: metronome.EngineConfig(threads=True), "threads"),  # type: ignore[arg-type]
        (lambda: metronome.TimingConfig(period=0), "period"),
        (lambda: metronome.TimingConfig(deadline=-1.0), "deadline"),
        (lambda: metronome.TimingConfig(period=float("nan")), "period"),
        (lambda: metronome.TimingConfig(max_chunk_tokens=0), "max_chunk_tokens"),
        (lambda: metronome.AdmissionConfig(decrease=1.0), "decrease"),
        (lambda: metronome.AdmissionConfig(target=0), "target"),
        (lambda: metronome.AdmissionConfig(percentile=1.5), "percentile"),
        (lambda: metronome.AdmissionConfig(initial_limit=100, max_limit=10), "initial_limit"),
        (lambda: metronome.AdmissionConfig(min_limit=0), "min_limit"),
        (lambda: metronome.AdmissionConfig(interval=0), "interval"),
        (lambda: metronome.AdmissionConfig(queue_timeout=-1), "queue_timeout"),
        (lambda: metronome.FixedRateCodec(tokens_per_frame=0), "tokens_per_frame"),
    ],
)
def test_bad_configuration_fails_when_made_and_names_the_field(make: object, field: str) -> None:
    with pytest.raises(ValueError, match=field):
        make()  # type: ignore[operator]


def test_configs_are_frozen_keyword_only_with_useful_defaults() -> None:
    timing = metronome.TimingConfig()
    assert timing.period == 0.080 and timing.frame_deadline == 0.080
    assert metronome.TimingConfig(deadline=0.2).frame_deadline == 0.2
    with pytest.raises(AttributeError):
        timing.period = 1.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        metronome.EngineConfig("smollm2-135m-instruct")  # type: ignore[misc]
    cfg = metronome.EngineConfig(kv="window", window=128, sinks=4)
    assert repr(cfg.kv_policy()) == "KVPolicy.windowed(128, sinks=4)"
    assert metronome.EngineConfig(kv="full").kv_policy().bounded is False
    assert cfg.pool_size() == {"memory_bytes": 256 << 20}
    assert "window=128" in repr(cfg)


def test_engine_takes_a_config_or_a_core_not_both() -> None:
    from metronome_engine import KVPolicy
    from tests.engine.tiny import tiny_engine

    with pytest.raises(ValueError, match="not both"):
        metronome.Engine(metronome.EngineConfig(), core=tiny_engine(KVPolicy.full(), num_blocks=8))


async def test_a_chunk_that_widens_the_bound_past_the_pool_fails_at_start() -> None:
    from metronome_engine import KVPolicy
    from tests.engine.tiny import tiny_engine

    core = tiny_engine(KVPolicy.windowed(8, sinks=4), num_blocks=6)  # holds the bound of chunk 1 (5 blocks)
    engine = metronome.Engine(core=core, timing=metronome.TimingConfig(max_chunk_tokens=64))
    with pytest.raises(ValueError, match="max_chunk_tokens"):
        async with engine:
            pass


@pytest.mark.real_model
def test_auto_and_fused_engines_share_one_copy_of_the_weights() -> None:
    # "auto" resolves before the shared-model cache: an engine it resolves to "fused" shares
    # the fused engine's copy (on AMX tiles, a second packed copy would double the process's
    # memory), one it resolves to "torch" the torch engine's; on every CPU
    import torch

    from metronome_engine import kernels
    from metronome_engine.engine import resolve_kernels

    engines = [metronome.Engine(metronome.EngineConfig(kernels=k, num_blocks=64)) for k in ("auto", "fused", "torch")]

    async def models() -> list[object]:
        loaded = []
        for engine in engines:
            async with engine:  # loads the model on the engine's core thread
                loaded.append(engine.core.model)  # type: ignore[attr-defined]
        return loaded

    auto, fused, plain = anyio.run(models)
    resolved = resolve_kernels("auto", torch.device("cpu"), model="smollm2-135m-instruct")
    assert auto is (fused if resolved == "fused" else plain)
    assert fused.packed == kernels.get_build().tiles_available()  # the tiles pack the weights; else float32
    assert plain is not fused and not plain.packed


@pytest.mark.real_model
@pytest.mark.timeout(120)
@pytest.mark.parametrize("threads", [3, None])
def test_engine_threads_are_set_before_the_kernels_are_chosen(
    threads: int | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the kernel choice reads torch's thread count (it is measured, and cached, per count): the
    # engine's must be set first. torch's setter is recorded, not run: this process keeps its one thread
    import torch

    from metronome_sdk._loading import load_core

    calls: list[object] = []
    get = torch.get_num_threads
    monkeypatch.setattr(torch, "set_num_threads", calls.append)
    monkeypatch.setattr(torch, "get_num_threads", lambda: calls.append("read") or get())
    load_core(metronome.EngineConfig(threads=threads, num_blocks=64))
    assert "read" in calls  # the kernel choice read the count
    assert calls[: calls.index("read")] == ([threads] if threads else [])
