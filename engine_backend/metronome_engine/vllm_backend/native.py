"""The CPU kernel of the sinks + window attention (``sink_window.cpp``), built on first use.

It reads vLLM's paged cache in place (either layout), where the torch pass in
``attention.py`` copies each tile's blocks out first. Built once per machine with the
flags of the engine kernels' build that engines use (``METRONOME_KERNELS_ISA``: the
machine's own vector unit by default; ``x86-64-v3`` or ``generic`` to run what an AVX2 or
an aarch64 machine runs) and cached under ``$METRONOME_CACHE/kernels/vllm-<key>/`` (the
key covers the source, the vector header it shares with the engine's kernels
(``kernels/vector16.h``), the flags, the torch build and the CPU); ``available()`` says
whether it loads here, and the backend falls back to the torch pass when it does not.
"""

from __future__ import annotations

import hashlib
import logging
import threading
from pathlib import Path

import torch
from torch import Tensor

__all__ = ["available", "head_size_supported", "sink_window_attention", "store_kv"]

log = logging.getLogger(__name__)

_SOURCE = Path(__file__).with_name("sink_window.cpp")
# what the cache key covers: the source and the vector helpers it shares with the engine's kernels
_KEYED = (_SOURCE, Path(__file__).parents[1] / "kernels" / "vector16.h")
# head sizes the kernel is instantiated for: 16 floats a vector, these many vectors
_VECTORS = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16)
_lock = threading.Lock()
_loaded: bool | None = None


def head_size_supported(head_size: int) -> bool:
    return head_size % 16 == 0 and head_size // 16 in _VECTORS


def _cflags() -> list[str]:
    """The engine kernels' flags for the build engines use (``kernels.default_isa``), less
    their op namespace: this kernel registers its own, ``metronome_vllm``."""
    # -fopenmp among them: at::parallel_for is inlined here and splits the work over OpenMP threads
    from ..kernels import get_build

    return [f for f in get_build().cflags() if not f.startswith("-DMETRONOME_OPS=")]


def _build_dir() -> Path:
    from ..kernels import _cpu_flags
    from ..paths import cache_dir

    key = hashlib.sha256()
    for path in _KEYED:
        key.update(path.read_bytes())
    for part in (torch.__version__, _cpu_flags(), " ".join(_cflags())):
        key.update(part.encode())
    return cache_dir() / "kernels" / f"vllm-{key.hexdigest()[:16]}"


def available() -> bool:
    """Whether the kernel loads here (building it if needed, once per process); never raises."""
    global _loaded
    with _lock:
        if _loaded is None:
            try:
                from torch.utils import cpp_extension

                from ..kernels import _put_ninja_on_path

                _put_ninja_on_path()
                target = _build_dir()
                target.mkdir(parents=True, exist_ok=True)
                cpp_extension.load(
                    name="metronome_vllm_kernels",
                    sources=[str(_SOURCE)],
                    extra_cflags=_cflags(),
                    extra_ldflags=["-fopenmp"],
                    build_directory=str(target),
                    is_python_module=False,
                    verbose=False,
                )
                _loaded = True
            except Exception as exc:  # a missing compiler surfaces as many different errors
                log.warning("the sinks + window CPU kernel is unavailable (%s): using the torch pass", exc)
                _loaded = False
        return _loaded


def sink_window_attention(
    q: Tensor,
    q_sink: Tensor | None,
    kv_cache: Tensor,
    block_table: Tensor,
    query_start_loc: Tensor,
    seq_lens: Tensor,
    out: Tensor,
    *,
    window: int,
    sinks: int,
    scale: float,
    rope_table: Tensor | None = None,
    neox: bool = True,
) -> None:
    """Write into ``out [T, H, d]`` the sinks + window attention of ``q [T, H, d]``.

    ``q`` is rotated at each query's stream index (window keys). The sink keys are scored
    with the query at its in-cache position: ``q_sink``, or, when it is ``None``, ``q``
    rotated back by ``p - c`` in the kernel with ``rope_table`` (vLLM's ``cos_sin_cache``,
    ``[positions, rotary_dim]``, cos then sin; ``neox``: rotate halves, else pairs), which
    holds for tables of ``cos/sin(position * frequency)``. ``kv_cache`` is vLLM's logical
    layer view ``[blocks, kv_heads, block_size, 2 * d]`` in any layout; the request metadata
    is vLLM's (int32). Call ``available()`` first.
    """
    torch.ops.metronome_vllm.sink_window_attention(
        q, q_sink, rope_table, neox, kv_cache, block_table, query_start_loc, seq_lens, window, sinks, scale, out
    )


def store_kv(key: Tensor, value: Tensor, kv_cache: Tensor, slot_mapping: Tensor) -> None:
    """Write ``key``/``value`` ``[T, kv_heads, d]`` (float32) at their slots of ``kv_cache`` (vLLM's
    logical layer view, any layout); padding slots (``-1``) are skipped. Call ``available()`` first."""
    torch.ops.metronome_vllm.store_kv(key, value, kv_cache, slot_mapping)
