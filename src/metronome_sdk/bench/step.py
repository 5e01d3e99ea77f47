"""Decode-step latency of the engine against HF transformers on the same weights and contexts."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

from metronome_engine import EngineCore, KVPolicy, StepRequest
from metronome_engine.engine import Kernels
from metronome_engine.model import LlamaModel
from metronome_engine.quant import Quantize
from metronome_engine.weights import load_model, resolve_model_dir

from .roofline import Roofline, RooflineProbe, decode_step_cost, measure_roofline

__all__ = ["StepResult", "contexts_for", "run_step_bench", "weights_layout"]


@dataclass(frozen=True, slots=True)
class StepResult:
    """One batch size's medians. ``floor_ms`` is the roofline measured in turn with the
    steps (the same load as ``engine_ms`` met); ``floor_peak_ms`` the machine's best,
    measured once before (see ``run_step_bench``)."""

    batch: int
    engine_ms: float
    hf_ms: float | None
    floor_ms: float
    context_min: int
    context_max: int
    floor_peak_ms: float
    gemm_gflops: float  # the in-turn roofline's rates
    copy_gbs: float
    baseline_ms: float | None = None  # the engine on --baseline's weights, in turn with the others

    def as_dict(self) -> dict[str, float | int | None]:
        d = asdict(self)
        d["engine_vs_hf"] = self.engine_ms / self.hf_ms if self.hf_ms else None
        d["engine_vs_floor"] = self.engine_ms / self.floor_ms
        d["engine_vs_floor_peak"] = self.engine_ms / self.floor_peak_ms
        d["engine_vs_baseline"] = self.engine_ms / self.baseline_ms if self.baseline_ms else None
        return d


def contexts_for(batch: int, lo: int = 128, hi: int = 272) -> list[int]:
    """Context lengths spread over ``[lo, hi)``, the same for both engines."""
    return [lo + (i * (hi - lo)) // batch for i in range(batch)]


def interleaved_medians(steppers: list[Callable[[], None]], steps: int) -> list[float]:
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
            step()
            mine.append((time.perf_counter() - t) * 1e3)
    return [statistics.median(mine) for mine in times]


def engine_stepper(
    model: LlamaModel, contexts: list[int], steps: int, seed: int = 0, kernels: Kernels = "auto"
) -> Callable[[], None]:
    need = sum(-(-(c + steps + 3) // 16) for c in contexts) + len(contexts)
    engine = EngineCore(model, policy=KVPolicy.full(), num_blocks=need, block_size=16, kernels=kernels)
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


def hf_stepper(model_name: str, contexts: list[int], seed: int = 0) -> Callable[[], None]:
    """HF's model class for the folder (``AutoModelForCausalLM``) with its ``DynamicCache``:
    left-padded batch, one token per step."""
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(str(resolve_model_dir(model_name)), dtype=torch.float32)
    hf.train(False)
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


def run_step_bench(
    batches: list[int],
    *,
    model: str = "smollm2-135m-instruct",
    steps: int = 10,
    with_hf: bool = True,
    kernels: Kernels = "auto",
    roofline: Roofline | None = None,
    on_progress: Callable[[str], None] | None = None,
    quantize: Quantize | None = None,
    baseline: str | None = None,
) -> tuple[Roofline, list[StepResult], str, str]:
    """Each batch's medians; the machine's peak roofline; and the engine path that ran
    (``"fused"`` or ``"torch"``) with its weights' layout (``weights_layout``).

    The floor is measured twice. Once before, as the best of five runs: the machine's
    peak. And once per batch, its two probes taken in turn with the engines' steps, as
    a median: on a shared machine the load swings 20-50% within a run, and the engines'
    medians meet that load, so the floor they are held to should meet it too.

    ``quantize`` quantizes ``model``'s weights on load; ``baseline`` (another model, as it
    loads) runs the engine on it too, its steps in turn with the rest: for instance a folder
    quantized here against the GGUF file it came from."""
    probe = RooflineProbe()
    peak = roofline or measure_roofline(probe=probe)
    weights = load_model(model, quantize=quantize)  # once: every batch's engine serves the same weights
    base = load_model(baseline) if baseline is not None else None
    results = []
    for batch in batches:
        ctx = contexts_for(batch)
        if on_progress:
            on_progress(f"batch {batch}: engine")
        steppers = [engine_stepper(weights, ctx, steps, kernels=kernels)]
        if base is not None:
            steppers.append(engine_stepper(base, ctx, steps, kernels=kernels))
        if with_hf:
            if on_progress:
                on_progress(f"batch {batch}: HF transformers")
            steppers.append(hf_stepper(model, ctx))
        steppers += [probe.gemm, probe.copy]
        if on_progress:
            on_progress(f"batch {batch}: {steps} steps of each, and of the roofline's probes, in turn")
        medians = interleaved_medians(steppers, steps)
        eng = medians[0]
        base_ms = medians[1] if base is not None else None
        hf = medians[1 + (base is not None)] if with_hf else None
        in_turn = probe.roofline(medians[-2] / 1e3, medians[-1] / 1e3)
        flops, moved = decode_step_cost(weights.config, ctx)
        results.append(
            StepResult(
                batch,
                eng,
                hf,
                in_turn.floor_ms(flops, moved),
                min(ctx),
                max(ctx),
                peak.floor_ms(flops, moved),
                in_turn.gemm_gflops,
                in_turn.copy_gbs,
                base_ms,
            )
        )
    return peak, results, "fused" if weights.packed else "torch", weights_layout(weights)


def weights_layout(model: LlamaModel) -> str:
    """``"tiles"`` (GGUF blocks on AMX tiles), ``"panels"`` (float32 panels, fused kernels)
    or ``"float32"`` (as loaded, torch path)."""
    if not model.packed:
        return "float32"
    return "tiles" if model.tiles else "panels"
