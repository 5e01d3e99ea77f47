"""This machine's roofline, measured now: fp32 GEMM rate and memory copy bandwidth; for the
honest floor also the read bandwidth and the bfloat16 GEMM rate (the AMX tiles' arithmetic)."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from metronome_engine import ModelConfig
from metronome_engine.model import LlamaModel

__all__ = ["Roofline", "RooflineProbe", "measure_roofline", "decode_step_cost", "engine_bytes_read"]


@dataclass(frozen=True, slots=True)
class Roofline:
    gemm_gflops: float  # fp32 2048^3 matmul
    copy_gbs: float  # tensor.copy_ of 256 MB, counting read + write

    def floor_ms(self, flops: float, bytes_moved: float) -> float:
        """The lower bound on a step: compute-bound or bandwidth-bound, whichever is slower."""
        return max(flops / (self.gemm_gflops * 1e9), bytes_moved / (self.copy_gbs * 1e9)) * 1e3


class RooflineProbe:
    """The two measurements behind a roofline: an fp32 2048^3 ``mm`` and a 256 MB copy.

    ``gemm`` and ``copy`` are steppers, so a benchmark can take them in turn with the
    engines' steps and meet the same load; ``roofline`` turns their times into rates.
    """

    N = 2048

    def __init__(self) -> None:
        self._a, self._b = torch.randn(self.N, self.N), torch.randn(self.N, self.N)
        self._src = torch.ones(64 * 1024 * 1024)  # 256 MB of fp32
        self._dst = torch.empty_like(self._src)
        self._a16: torch.Tensor | None = None

    def gemm(self) -> None:
        torch.mm(self._a, self._b)

    def copy(self) -> None:
        self._dst.copy_(self._src)

    def read(self) -> None:
        """Reads the 256 MB once (a sum): what a step does with its weights."""
        self._src.sum()

    def gemm_bf16(self) -> None:
        if self._a16 is None:
            self._a16, self._b16 = self._a.bfloat16(), self._b.bfloat16()
        torch.mm(self._a16, self._b16)

    def read_gbs(self, read_s: float) -> float:
        return self._src.numel() * 4 / read_s / 1e9

    def bf16_gflops(self, gemm_s: float) -> float:
        return 2 * self.N**3 / gemm_s / 1e9

    def roofline(self, gemm_s: float, copy_s: float) -> Roofline:
        return Roofline(
            gemm_gflops=2 * self.N**3 / gemm_s / 1e9,
            copy_gbs=2 * self._src.numel() * 4 / copy_s / 1e9,  # read + write
        )


def _best_of(fn: Callable[[], None], repeats: int) -> float:
    fn()
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def measure_roofline(repeats: int = 5, probe: RooflineProbe | None = None) -> Roofline:
    """The machine's peak: the best of ``repeats`` runs of each measurement."""
    probe = probe or RooflineProbe()
    return probe.roofline(_best_of(probe.gemm, repeats), _best_of(probe.copy, repeats))


def decode_step_cost(config: ModelConfig, contexts: list[int]) -> tuple[float, float]:
    """(FLOPs, bytes) of one decode step: one new token per session at these context lengths.

    Bytes count every weight read once plus each session's K/V read once.
    """
    c = config
    q_out, kv_out = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    per_layer = c.hidden_size * (q_out + 2 * kv_out) + q_out * c.hidden_size + 3 * c.hidden_size * c.intermediate_size
    weights = c.num_layers * per_layer + c.vocab_size * c.hidden_size
    batch = len(contexts)
    attn_flops = sum(4 * (ctx + 1) * q_out * c.num_layers for ctx in contexts)
    flops = 2.0 * weights * batch + attn_flops
    kv_bytes = sum((ctx + 1) * c.kv_bytes_per_token(4) for ctx in contexts)
    return flops, 4.0 * weights + kv_bytes


def engine_bytes_read(model: LlamaModel, contexts: list[int], *, groups: bool = False) -> float:
    """Bytes one decode step of the engine reads: its dense weights as the step reads them
    (4-bit blocks with their scales in tiles or, with ``groups``, in column groups; or
    float32) once, the head once, and each session's float32 K/V once."""
    c = model.config
    dense = sum(t.numel() * t.element_size() for t in model.fused_weights(groups=groups))
    heads = (model.head_groups,) if groups else (model.lm_head, model.head_scale, model.head_offset)
    head = sum(t.numel() * t.element_size() for t in heads)
    kv = sum((ctx + 1) * c.kv_bytes_per_token(4) for ctx in contexts)
    return float(dense + head + kv)
