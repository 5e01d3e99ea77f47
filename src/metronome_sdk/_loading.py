"""Loading the embedded engine: the model and tokenizer an ``EngineConfig`` names, shared per process.

Runs on the engine's core thread (loading takes seconds; the event loop never waits on it).
"""

from __future__ import annotations

import functools
from typing import Any, Literal

from metronome_engine import EngineCore

from ._codec import TextTokenizer
from ._config import EngineConfig

__all__: list[str] = []  # internal: load_core, load_tokenizer


@functools.lru_cache(maxsize=4)
def _shared_model(model: str, device: str, path: str, quantize: Literal["q8_0", "q4_1"] | None = None) -> Any:
    # weights are read-only at inference: engines of the same model share them. One copy
    # per engine path ("auto" resolved first): the fused kernels pack the weights in place,
    # where the torch path cannot read them
    from metronome_engine.weights import load_model

    return load_model(model, device=device, quantize=quantize)


@functools.lru_cache(maxsize=4)
def load_tokenizer(model: str) -> TextTokenizer:
    from metronome_engine.tokenizer import Tokenizer

    return Tokenizer(model)


def load_core(cfg: EngineConfig) -> EngineCore:
    import torch

    from metronome_engine.engine import resolve_kernels
    from metronome_engine.weights import has_blocks

    if cfg.threads is not None:  # before the kernel choice: it is measured, and cached, per thread count
        torch.set_num_threads(cfg.threads)
    blocks = has_blocks(cfg.model, cfg.quantize)
    path = resolve_kernels(cfg.kernels, torch.device(cfg.device), model=cfg.model, blocks=blocks)
    model = _shared_model(cfg.model, cfg.device, path, cfg.quantize)
    pool = cfg.pool_size()
    return EngineCore(
        model,
        policy=cfg.kv_policy(),
        num_blocks=pool.get("num_blocks"),
        memory_bytes=pool.get("memory_bytes"),
        block_size=cfg.block_size,
        # "auto" stays "auto": the engine then runs each regime on its measured winner (the
        # column groups on AVX2); its choice is cached, so resolving it again costs nothing
        kernels=cfg.kernels if cfg.kernels == "auto" else path,
    )
