"""Which attention backend serves a layer: the one module that knows all three (the CUDA, CPU and torch
backends do not import each other)."""

from __future__ import annotations

import torch
from vllm.v1.attention.backend import AttentionBackend

from .attn_backend import SinkWindowFlashBackend, SinkWindowTorchBackend
from .checks import check_kv_cache_dtype, check_layer_dtype
from .cpu_backend import SinkWindowCpuBackend, usable

__all__ = ["select_backend"]


def select_backend(head_size: int, dtype: torch.dtype, kv_cache_dtype: str) -> type[AttentionBackend]:
    """FlashAttention's kernel for the window on CUDA (untested: no GPU has run it); on CPU the
    C++ kernel reading the cache in place where it serves the layer (float32, see
    ``cpu_backend``); the torch pass elsewhere.

    Refuses what no backend here runs right (``checks.py``): a quantized KV cache anywhere, and
    on CUDA a dtype FlashAttention lacks (an explicitly named backend skips vLLM's validation)."""
    from vllm.platforms import current_platform

    check_kv_cache_dtype(kv_cache_dtype)
    check_layer_dtype(str(dtype).removeprefix("torch."), cuda=current_platform.is_cuda())
    if current_platform.is_cuda():
        return SinkWindowFlashBackend()
    if current_platform.is_cpu() and usable(head_size, dtype, kv_cache_dtype):
        return SinkWindowCpuBackend
    return SinkWindowTorchBackend
