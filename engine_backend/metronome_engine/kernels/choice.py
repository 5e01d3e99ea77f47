"""``kernels="auto"``: the engine's path chosen by timing the candidates on this machine.

The choice is made for the model that is loaded: whether its weights come as blocks (a GGUF
file, or quantized on load) decides which candidates can run at all. The candidates are the
plain torch path and the fused kernels of the engine's build (``METRONOME_KERNELS_ISA``,
default native; x86-64-v3 is what an AVX2 machine's native build is, x86-64-v4 an AVX-512
machine's without tiles): on the float32 weights (the BLAS), or on AMX tiles where the build
has them and the model has blocks; and, for a model with blocks on a build without tiles,
the fused kernels with the dense layers read from column groups of 4-bit blocks
(``-groups``, kernels/groups.cpp). Each candidate is an engine made by the ``make_engine``
the caller passes (``EngineCore``: the engine asks this module, never the other way round),
and is run once before it is timed;
one that cannot run the model is left out (``KernelChoice.dropped`` says why), never timed
or chosen. Each is timed on a model of the engine's shapes with random weights (GGUF-like
4-bit blocks and an 8-bit head, or float32 for a model without blocks) in four regimes: a
decode step of one session, of 8 and of 32 sessions, and a 64-token prefill chunk. The
times and the choice are cached beside the kernel builds, keyed by the builds, the shapes,
the blocks and the thread count, so this runs once per machine, not per start.

Where the tiles pack the weights in place, the torch path cannot read them and an engine
runs one path for all its steps: the candidate whose worst regime is closest to that
regime's best (each regime's own winner is reported too). Without tiles every path reads
the model, and an engine runs each step on the winner of the regime nearest it
(``regime_paths``, ``nearest_regime``).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal, Protocol, cast

import torch

from . import Isa, KernelBuild, get_build

if TYPE_CHECKING:
    from ..backend import StepOutput, StepRequest
    from ..config import ModelConfig
    from ..kv_policy import KVPolicy
    from ..model import LlamaModel

__all__ = [
    "REGIMES",
    "EngineFactory",
    "KernelChoice",
    "StepPath",
    "choose_kernels",
    "nearest_regime",
    "pick",
    "regime_paths",
]

# what one step runs on: the torch path, the fused kernels on the float32 weights, or the
# fused kernels with the dense layers read from column groups of blocks (model.pack_groups)
StepPath = Literal["torch", "fused", "groups"]


class Stepper(Protocol):
    """What the timing needs of an engine (``EngineCore`` is one)."""

    def add_sequence(self) -> int: ...

    def step(self, requests: Sequence[StepRequest]) -> list[StepOutput]: ...

    def free_sequence(self, seq_id: int) -> None: ...

    def pin_paths(self, paths: Mapping[str, StepPath]) -> None: ...


class EngineFactory(Protocol):
    """Makes one candidate engine (``EngineCore`` itself is one)."""

    def __call__(
        self,
        model: LlamaModel,
        *,
        policy: KVPolicy,
        num_blocks: int,
        block_size: int,
        kernels: Literal["fused", "torch"],
        isa: Isa | None,
    ) -> Stepper: ...


log = logging.getLogger(__name__)

# regime -> (sessions, context tokens already cached, new tokens per session)
REGIMES: dict[str, tuple[int, int, int]] = {
    "decode_1": (1, 16, 1),
    "decode_8": (8, 16, 1),
    "decode_32": (32, 16, 1),
    "prefill_64": (1, 16, 64),
}
_REPS = 5


@dataclass(frozen=True, slots=True)
class KernelChoice:
    """What ``kernels="auto"`` runs: ``path`` (``"fused"`` or ``"torch"``) and, for the
    fused path, the build's ``isa`` and whether its dense layers read column groups of
    blocks (``groups``); ``times_ms``: candidate -> regime -> median ms; ``fastest``:
    regime -> the candidate fastest there; ``dropped``: the candidates that could not run
    a model of this kind (``blocks``), and why."""

    path: Literal["fused", "torch"]
    isa: Isa | None
    times_ms: dict[str, dict[str, float]]
    fastest: dict[str, str]
    threads: int
    groups: bool = False
    blocks: bool = True  # whether the model it was made for has blocks that are its weights
    dropped: dict[str, str] = field(default_factory=dict)  # candidate -> why it could not run

    @property
    def name(self) -> str:
        return _name(self.path, self.isa, self.groups)

    def as_dict(self) -> dict[str, object]:
        d = asdict(self)
        d["chosen"] = self.name
        return d


def _name(path: str, isa: Isa | None, groups: bool = False) -> str:
    return "torch" if path == "torch" else f"fused-{isa}" + ("-groups" if groups else "")


def _step_path(name: str) -> StepPath:
    return "torch" if name == "torch" else "groups" if name.endswith("-groups") else "fused"


def nearest_regime(sessions: int, new_tokens: int) -> str:
    """The regime a step of ``sessions`` sessions, the longest adding ``new_tokens``, is
    nearest: a prefill chunk, or the decode step whose session count is nearest in ratio."""
    if new_tokens > 1:
        return "prefill_64"
    decodes = [r for r, (_, _, new) in REGIMES.items() if new == 1]
    return min(decodes, key=lambda r: abs(math.log(max(sessions, 1) / REGIMES[r][0])))


def regime_paths(choice: KernelChoice, *, groups: bool) -> dict[str, StepPath]:
    """Each regime's fastest path (``"torch"``, ``"fused"`` or ``"groups"``) among those the
    model can run: without ``groups`` (no blocks that are its weights), the fastest of the
    others where the times are known, else the float32 fused path."""
    out: dict[str, StepPath] = {}
    for regime, name in choice.fastest.items():
        if name.endswith("-groups") and not groups:
            others = {c: t[regime] for c, t in choice.times_ms.items() if not c.endswith("-groups") and regime in t}
            name = min(others, key=lambda c: others[c]) if others else name.removesuffix("-groups")
        out[regime] = _step_path(name)
    return out


def _candidate_builds(isa: Isa | None) -> list[KernelBuild]:
    build = get_build(isa)
    return [build] if build.available() else []


def _choice_dir(build: KernelBuild) -> Path:
    return build.build_dir().parent  # beside the builds


def _cache_key(config: ModelConfig, builds: list[KernelBuild], blocks: bool) -> str:
    key = hashlib.sha256(json.dumps(asdict(config), sort_keys=True, default=str).encode())
    for b in builds:
        key.update(b.build_dir().name.encode())
    key.update(f"threads={torch.get_num_threads()} regimes={REGIMES} reps={_REPS} blocks={blocks}".encode())
    return key.hexdigest()[:16]


def choose_kernels(
    config: ModelConfig, isa: Isa | None = None, *, blocks: bool = True, make_engine: EngineFactory
) -> KernelChoice:
    """The measured choice for a model of ``config``'s shapes, with (``blocks``) or without
    blocks that are its weights (cached on disk); ``make_engine`` makes the candidates."""
    builds = _candidate_builds(isa)
    if not builds:
        return KernelChoice("torch", None, {}, {}, torch.get_num_threads(), blocks=blocks)
    path = _choice_dir(builds[0]) / f"choice-{_cache_key(config, builds, blocks)}.json"
    if path.exists():
        try:
            d = json.loads(path.read_text())
            return KernelChoice(
                d["path"], d["isa"], d["times_ms"], d["fastest"], d["threads"], d["groups"], d["blocks"], d["dropped"]
            )
        except (OSError, ValueError, KeyError):
            pass  # a torn or old file: time again
    choice = _measure(config, builds, blocks, make_engine)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(choice.as_dict(), indent=1))
    tmp.replace(path)
    log.info("kernels.auto measured: %s", json.dumps(choice.as_dict()))
    return choice


def _measure(config: ModelConfig, builds: list[KernelBuild], blocks: bool, make_engine: EngineFactory) -> KernelChoice:
    # (name, path, build) of each candidate
    candidates: list[tuple[str, StepPath, Isa | None]] = [("torch", "torch", None)]
    for b in builds:
        candidates.append((_name("fused", b.isa), "fused", b.isa))
        if blocks and not b.tiles_available():
            candidates.append((_name("fused", b.isa, groups=True), "groups", b.isa))
    times, dropped = _time_paths(config, candidates, blocks, make_engine)
    chosen, fastest = pick(times)
    isa = None if chosen == "torch" else cast(Isa, chosen.removeprefix("fused-").removesuffix("-groups"))
    path: Literal["fused", "torch"] = "torch" if chosen == "torch" else "fused"
    groups = _step_path(chosen) == "groups"
    return KernelChoice(path, isa, times, fastest, torch.get_num_threads(), groups, blocks, dropped)


def pick(times: dict[str, dict[str, float]]) -> tuple[str, dict[str, str]]:
    """The candidate whose worst ratio to a regime's best time is smallest (ties: the first
    listed), and each regime's fastest candidate."""
    regimes = list(next(iter(times.values())))
    best = {r: min(t[r] for t in times.values()) for r in regimes}
    fastest = {r: min(times, key=lambda c: times[c][r]) for r in regimes}
    chosen = min(times, key=lambda c: max(times[c][r] / best[r] for r in regimes))
    return chosen, fastest


def _time_paths(
    config: ModelConfig, candidates: list[tuple[str, StepPath, Isa | None]], blocks: bool, make_engine: EngineFactory
) -> tuple[dict[str, dict[str, float]], dict[str, str]]:
    """Candidate -> regime -> median ms, and candidate -> why it was left out. Each candidate
    is made and stepped once first: one that cannot run the model (the column groups of a
    model whose shapes have no blocks, a build that does not load) is left out, not timed.
    The candidates' steps are timed in turn, one of each per round, so that a load that
    comes and goes on a shared machine meets them all alike (timed one after the other, a
    busy minute once made the winner look 10x slower)."""
    from ..backend import StepRequest
    from ..kv_policy import KVPolicy

    gen = torch.Generator().manual_seed(0)
    vocab = config.vocab_size
    blocks_needed = sum(s * (-(-(c + n * (_REPS + 2)) // 16) + 1) for s, c, n in REGIMES.values())
    shared = _random_model(config, blocks=blocks)
    engines: list[Stepper] = []
    timed: list[str] = []
    dropped: dict[str, str] = {}
    for name, path, isa in candidates:
        try:
            # the tiles pack a model's weights in place, where the other paths cannot read them
            tiles = path == "fused" and blocks and get_build(isa).tiles_available()
            kernels: Literal["fused", "torch"] = "torch" if path == "torch" else "fused"
            model = _random_model(config, blocks=True) if tiles else shared
            engine = make_engine(
                model, policy=KVPolicy.full(), num_blocks=blocks_needed, block_size=16, kernels=kernels, isa=isa
            )
            if path == "groups":
                engine.pin_paths(dict.fromkeys(REGIMES, "groups"))
            _check_runs(engine, vocab)
        except (ValueError, RuntimeError) as exc:  # KernelBuildError is a RuntimeError
            dropped[name] = str(exc)
            log.info("kernels.auto leaves out %s: %s", name, exc)
            continue
        engines.append(engine)
        timed.append(name)
    out: dict[str, dict[str, float]] = {name: {} for name in timed}
    for regime, (sessions, context, new) in REGIMES.items():
        seqs = []
        for engine in engines:
            seqs.append([engine.add_sequence() for _ in range(sessions)])
            prompt = [StepRequest(s, torch.randint(0, vocab, (context,), generator=gen).tolist()) for s in seqs[-1]]
            engine.step(prompt)
        ms: list[list[float]] = [[] for _ in engines]
        for rep in range(_REPS + 1):
            for i, engine in enumerate(engines):
                reqs = [StepRequest(s, torch.randint(0, vocab, (new,), generator=gen).tolist()) for s in seqs[i]]
                t = time.perf_counter()
                engine.step(reqs)
                if rep:  # the first is a warm-up
                    ms[i].append((time.perf_counter() - t) * 1e3)
        for i, engine in enumerate(engines):
            out[timed[i]][regime] = statistics.median(ms[i])
            for s in seqs[i]:
                engine.free_sequence(s)
    return out, dropped


def _check_runs(engine: Stepper, vocab: int) -> None:
    """One prefill and one decode step of one session, with finite logits: ``ValueError`` if not."""
    from ..backend import StepRequest

    seq = engine.add_sequence()
    try:
        for tokens in ([1 % vocab, 2 % vocab, 3 % vocab], [4 % vocab]):
            (out,) = engine.step([StepRequest(seq, tokens, return_logits=True)])
            if out.logits is None or not bool(torch.isfinite(out.logits).all()):
                raise ValueError(f"its step gave no finite logits ({out.stall or 'non-finite'})")
    finally:
        engine.free_sequence(seq)


def _random_model(config: ModelConfig, *, blocks: bool) -> LlamaModel:
    """A model of ``config``'s shapes whose weights are random GGUF-like blocks (4-bit dense
    layers, an 8-bit embedding and head), which it can pack into tiles or column groups as
    a model read from a GGUF file can; without ``blocks``, the same float32 weights and no
    blocks, as a model read from safetensors."""
    from ..model import LlamaModel
    from ..quant import QuantBlocks

    c = config
    gen = torch.Generator().manual_seed(0)
    q_out, kv_out = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    shapes = {"model.embed_tokens.weight": (c.vocab_size, c.hidden_size)}
    if not c.tie_word_embeddings:
        shapes["lm_head.weight"] = (c.vocab_size, c.hidden_size)
    for i in range(c.num_layers):
        p = f"model.layers.{i}."
        for name, n, k in (
            ("self_attn.q_proj", q_out, c.hidden_size),
            ("self_attn.k_proj", kv_out, c.hidden_size),
            ("self_attn.v_proj", kv_out, c.hidden_size),
            ("self_attn.o_proj", c.hidden_size, q_out),
            ("mlp.gate_proj", c.intermediate_size, c.hidden_size),
            ("mlp.up_proj", c.intermediate_size, c.hidden_size),
            ("mlp.down_proj", c.hidden_size, c.intermediate_size),
        ):
            shapes[p + name + ".weight"] = (n, k)
    quant_blocks: dict[str, QuantBlocks] = {}
    state: dict[str, torch.Tensor] = {"model.norm.weight": torch.ones(c.hidden_size)}
    for name, (n, k) in shapes.items():
        if k % 32 == 0 and name in ("model.embed_tokens.weight", "lm_head.weight"):
            scale = (torch.rand(n, k // 32, generator=gen) * 0.0003).half().float()
            quant_blocks[name] = QuantBlocks(
                torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8), scale, None
            )
            state[name] = quant_blocks[name].dequantize()
        elif k % 32 == 0:
            scale = (torch.rand(n, k // 32, generator=gen) * 0.01).half().float()
            quant_blocks[name] = QuantBlocks(
                torch.randint(0, 16, (n, k), generator=gen, dtype=torch.int8), scale, -8 * scale
            )
            state[name] = quant_blocks[name].dequantize()
        else:
            state[name] = torch.randn(n, k, generator=gen) * 0.02
    for i in range(c.num_layers):
        for norm in ("input_layernorm", "post_attention_layernorm"):
            state[f"model.layers.{i}.{norm}.weight"] = torch.ones(c.hidden_size)
    model = LlamaModel(c)
    model.load_hf_state_dict(state)
    if blocks and quant_blocks:
        model.block_source = lambda: quant_blocks
    return model.eval()
