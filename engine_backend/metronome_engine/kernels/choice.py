"""``kernels="auto"``: the engine's path chosen by timing the candidates on this machine.

The candidates are the plain torch path and the fused kernels of the engine's build
(``METRONOME_KERNELS_ISA``, default native; the x86-64-v3 build is what an AVX2 machine's
native one is). Each is timed on a model of the engine's shapes with random weights (GGUF-like 4-bit blocks
where the build has AMX tiles, so the tiles are what is timed) in three regimes: a decode
step of one session, a decode step of 32 sessions, and a 64-token prefill chunk. The
times and the choice are cached beside the kernel builds, keyed by the builds, the shapes
and the thread count, so this runs once per machine, not per start.

An engine runs one path for all its steps: the tiles pack the weights in place, where
the torch path cannot read them. So the choice is the candidate whose worst regime is
closest to that regime's best (each regime's own winner is reported too); with one
candidate fastest everywhere, that is the one.
"""

from __future__ import annotations

import hashlib
import json
import logging
import statistics
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, cast

import torch

from . import Isa, KernelBuild, get_build

if TYPE_CHECKING:
    from ..config import ModelConfig
    from ..model import LlamaModel

__all__ = ["REGIMES", "KernelChoice", "choose_kernels", "pick"]

log = logging.getLogger(__name__)

# regime -> (sessions, context tokens already cached, new tokens per session)
REGIMES: dict[str, tuple[int, int, int]] = {
    "decode_1": (1, 16, 1),
    "decode_32": (32, 16, 1),
    "prefill_64": (1, 16, 64),
}
_REPS = 3


@dataclass(frozen=True, slots=True)
class KernelChoice:
    """What ``kernels="auto"`` runs: ``path`` (``"fused"`` or ``"torch"``) and, for the
    fused path, the build's ``isa``; ``times_ms``: candidate -> regime -> median ms;
    ``fastest``: regime -> the candidate fastest there."""

    path: Literal["fused", "torch"]
    isa: Isa | None
    times_ms: dict[str, dict[str, float]]
    fastest: dict[str, str]
    threads: int

    @property
    def name(self) -> str:
        return _name(self.path, self.isa)

    def as_dict(self) -> dict[str, object]:
        d = asdict(self)
        d["chosen"] = self.name
        return d


def _name(path: str, isa: Isa | None) -> str:
    return "torch" if path == "torch" else f"fused-{isa}"


def _candidate_builds(isa: Isa | None) -> list[KernelBuild]:
    build = get_build(isa)
    return [build] if build.available() else []


def _choice_dir(build: KernelBuild) -> Path:
    return build.build_dir().parent  # beside the builds


def _cache_key(config: ModelConfig, builds: list[KernelBuild]) -> str:
    key = hashlib.sha256(json.dumps(asdict(config), sort_keys=True, default=str).encode())
    for b in builds:
        key.update(b.build_dir().name.encode())
    key.update(f"threads={torch.get_num_threads()} regimes={REGIMES} reps={_REPS}".encode())
    return key.hexdigest()[:16]


def choose_kernels(config: ModelConfig, isa: Isa | None = None) -> KernelChoice:
    """The measured choice for a model of ``config``'s shapes (cached on disk)."""
    builds = _candidate_builds(isa)
    if not builds:
        return KernelChoice("torch", None, {}, {}, torch.get_num_threads())
    path = _choice_dir(builds[0]) / f"choice-{_cache_key(config, builds)}.json"
    if path.exists():
        try:
            d = json.loads(path.read_text())
            return KernelChoice(d["path"], d["isa"], d["times_ms"], d["fastest"], d["threads"])
        except (OSError, ValueError, KeyError):
            pass  # a torn or old file: time again
    choice = _measure(config, builds)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(choice.as_dict(), indent=1))
    tmp.replace(path)
    log.info("kernels.auto measured: %s", json.dumps(choice.as_dict()))
    return choice


def _measure(config: ModelConfig, builds: list[KernelBuild]) -> KernelChoice:
    model = _random_model(config, tiles=any(b.tiles_available() for b in builds))
    times: dict[str, dict[str, float]] = {"torch": _time_path(model, "torch", None)}
    # the tiles pack the weights in place: time the builds that keep them float32 first
    for b in sorted(builds, key=lambda b: b.tiles_available()):
        times[_name("fused", b.isa)] = _time_path(model, "fused", b.isa)
    chosen, fastest = pick(times)
    isa = None if chosen == "torch" else cast(Isa, chosen.removeprefix("fused-"))
    return KernelChoice("torch" if chosen == "torch" else "fused", isa, times, fastest, torch.get_num_threads())


def pick(times: dict[str, dict[str, float]]) -> tuple[str, dict[str, str]]:
    """The candidate whose worst ratio to a regime's best time is smallest (ties: the first
    listed), and each regime's fastest candidate."""
    regimes = list(next(iter(times.values())))
    best = {r: min(t[r] for t in times.values()) for r in regimes}
    fastest = {r: min(times, key=lambda c: times[c][r]) for r in regimes}
    chosen = min(times, key=lambda c: max(times[c][r] / best[r] for r in regimes))
    return chosen, fastest


def _time_path(model: LlamaModel, path: Literal["fused", "torch"], isa: Isa | None) -> dict[str, float]:
    from ..backend import StepRequest
    from ..engine import EngineCore
    from ..kv_policy import KVPolicy

    gen = torch.Generator().manual_seed(0)
    vocab = model.config.vocab_size
    blocks = sum(s * (-(-(c + n * (_REPS + 2)) // 16) + 1) for s, c, n in REGIMES.values())
    engine = EngineCore(model, policy=KVPolicy.full(), num_blocks=blocks, block_size=16, kernels=path, isa=isa)
    out: dict[str, float] = {}
    for regime, (sessions, context, new) in REGIMES.items():
        seqs = [engine.add_sequence() for _ in range(sessions)]
        engine.step([StepRequest(s, torch.randint(0, vocab, (context,), generator=gen).tolist()) for s in seqs])
        ms: list[float] = []
        for rep in range(_REPS + 1):
            reqs = [StepRequest(s, torch.randint(0, vocab, (new,), generator=gen).tolist()) for s in seqs]
            t = time.perf_counter()
            engine.step(reqs)
            if rep:  # the first is a warm-up
                ms.append((time.perf_counter() - t) * 1e3)
        out[regime] = statistics.median(ms)
        for s in seqs:
            engine.free_sequence(s)
    return out


def _random_model(config: ModelConfig, *, tiles: bool) -> LlamaModel:
    """A model of ``config``'s shapes. With ``tiles``, its dense weights are random 4-bit
    GGUF-like blocks it can pack into tiles, as a model read from a GGUF file can."""
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
    blocks: dict[str, QuantBlocks] = {}
    state: dict[str, torch.Tensor] = {"model.norm.weight": torch.ones(c.hidden_size)}
    for name, (n, k) in shapes.items():
        if tiles and k % 32 == 0:
            scale = (torch.rand(n, k // 32, generator=gen) * 0.01).half().float()
            blocks[name] = QuantBlocks(torch.randint(0, 16, (n, k), generator=gen, dtype=torch.int8), scale, -8 * scale)
            state[name] = blocks[name].dequantize()
        else:
            state[name] = torch.randn(n, k, generator=gen) * 0.02
    for i in range(c.num_layers):
        for norm in ("input_layernorm", "post_attention_layernorm"):
            state[f"model.layers.{i}.{norm}.weight"] = torch.ones(c.hidden_size)
    model = LlamaModel(c)
    model.load_hf_state_dict(state)
    if blocks:
        model.block_source = lambda: blocks
    return model.eval()
