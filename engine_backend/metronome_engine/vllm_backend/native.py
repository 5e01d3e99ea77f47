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
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import Tensor

from ..kernels import KernelBuild, compile_and_load, get_build
from ..paths import cache_dir

__all__ = ["SOURCES", "SinkWindowBuild", "available", "head_size_supported", "sink_window_attention", "store_kv"]

log = logging.getLogger(__name__)

# what the cache key covers: the source and the vector helpers it shares with the engine's kernels
SOURCES = (Path(__file__).with_name("sink_window.cpp"), Path(__file__).parents[1] / "kernels" / "vector16.h")
# head sizes the kernel is instantiated for: 16 floats a vector, these many vectors
_VECTORS = (1, 2, 3, 4, 5, 6, 7, 8, 10, 12, 16)


def head_size_supported(head_size: int) -> bool:
    return head_size % 16 == 0 and head_size // 16 in _VECTORS


@dataclass(eq=False)
class SinkWindowBuild:
    """The sinks + window kernel built with the flags of one build of the engine's kernels
    (``kernels``; default: the one engines use, ``kernels.get_build()``, asked when it is
    first needed) from ``sources`` (default ``SOURCES``: every ``.cpp`` is compiled, every
    file keys the build). The process loads its own (``available()``); another one says
    the flags and the folder a build would have (for another CPU or vector unit)."""

    kernels: KernelBuild | None = None
    sources: tuple[Path, ...] = SOURCES
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _loaded: bool | None = field(default=None, repr=False)

    def cflags(self) -> list[str]:
        """The engine kernels' flags, less their op namespace: this kernel registers its own,
        ``metronome_vllm``."""
        # -fopenmp among them: at::parallel_for is inlined here and splits the work over OpenMP threads
        return [f for f in self._kernels().cflags() if not f.startswith("-DMETRONOME_OPS=")]

    def build_dir(self) -> Path:
        """Where the build goes: ``$METRONOME_CACHE/kernels/vllm-<key>``, the key covering
        the sources, the torch build, the CPU and the flags."""
        key = hashlib.sha256()
        for path in self.sources:
            key.update(path.read_bytes())
        for part in (torch.__version__, self._kernels().cpu.key, " ".join(self.cflags())):
            key.update(part.encode())
        return cache_dir() / "kernels" / f"vllm-{key.hexdigest()[:16]}"

    def available(self) -> bool:
        """Whether the kernel loads here (building it if needed, once); never raises."""
        with self._lock:
            if self._loaded is None:
                try:
                    self._build_and_load()
                    self._loaded = True
                except Exception as exc:  # a missing compiler surfaces as many different errors
                    log.warning("the sinks + window CPU kernel is unavailable (%s): using the torch pass", exc)
                    self._loaded = False
            return self._loaded

    def _kernels(self) -> KernelBuild:
        return self.kernels or get_build()

    def _build_and_load(self) -> None:
        compile_and_load("metronome_vllm_kernels", self.sources, self.cflags(), self.build_dir())


_build = SinkWindowBuild()  # the process's: one op namespace, loaded once


def available() -> bool:
    """Whether the process's kernel loads here (building it if needed, once per process); never raises."""
    return _build.available()


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
