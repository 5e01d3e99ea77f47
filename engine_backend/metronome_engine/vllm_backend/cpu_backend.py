"""The sinks + window attention backend on CPU: the C++ kernel reading vLLM's cache in place.

``SinkWindowCpuBackend`` runs ``native.sink_window_attention`` (``sink_window.cpp``): per
request and kv head, block by block through the block table, the sinks scored with the query
at its in-cache position and the window with the query at its stream index, one online
softmax over both. It reads the cache where vLLM keeps it (either layout), as vLLM's own CPU
kernel does; the torch backend (``attn_backend.SinkWindowTorchBackend``) copies each tile's
blocks out first and relocates the sinks, and stays the fallback where the kernel does not
build or the model is not float32. The kernel rotates the query back to its in-cache
position itself (with the model's RoPE table) where that table is
``cos/sin(position * frequency)``; for any other rotary embedding the layer hands it the
packed query (``packs_sink_query``): ``[T, 2 * H, d]``, the query at its stream index then
at its in-cache position.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import Tensor
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionCGSupport,
    AttentionMetadataBuilder,
    CommonAttentionMetadata,
)

from . import native
from .attn_backend import SinkWindowImpl, split_query

__all__ = ["CPU_BACKEND_NAME", "SinkWindowCpuBackend"]

CPU_BACKEND_NAME = "METRONOME_SINK_WINDOW_CPU"


@dataclass
class SinkWindowCpuMetadata:
    num_actual_tokens: int
    query_start_loc: Tensor  # int32, as vLLM builds them
    seq_lens: Tensor
    block_table: Tensor
    slot_mapping: Tensor


class SinkWindowCpuBuilder(AttentionMetadataBuilder[SinkWindowCpuMetadata]):  # type: ignore[misc]
    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.NEVER

    def __init__(self, kv_cache_spec: Any, layer_names: list[str], vllm_config: Any, device: torch.device) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)

    def build(
        self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata, fast_build: bool = False
    ) -> SinkWindowCpuMetadata:
        del common_prefix_len, fast_build
        cm = common_attn_metadata
        # the kernel walks the block table itself: nothing to precompute per step
        return SinkWindowCpuMetadata(
            num_actual_tokens=cm.num_actual_tokens,
            query_start_loc=cm.query_start_loc.int(),
            seq_lens=cm.seq_lens.int(),
            block_table=cm.block_table_tensor.int().contiguous(),
            slot_mapping=cm.slot_mapping,
        )


class SinkWindowCpuImpl(SinkWindowImpl[SinkWindowCpuMetadata]):
    # the model's rotary embedding, set by model.swap_attention_layers where its table is
    # cos/sin(position * frequency): the kernel then rotates the sink query itself (the
    # layer passes the plain query); without it the layer packs both rotations
    rope: Any = None

    def _attend(self, query: Tensor, kv_cache: Tensor, md: SinkWindowCpuMetadata, output: Tensor) -> None:
        n = md.num_actual_tokens
        table: Tensor | None = None
        if self.rope is None:  # the layer packed both rotations of the query (with sinks)
            q, q_sink = split_query(query, n, self.num_heads, self.sink_tokens)
        else:
            q, q_sink = query[:n], None
            if self.sink_tokens:
                table = self.rope.cos_sin_cache
        native.sink_window_attention(
            q,
            q_sink,
            kv_cache,
            md.block_table,
            md.query_start_loc,
            md.seq_lens,
            output[:n].view(n, self.num_heads, self.head_size),
            window=self.window,
            sinks=self.sink_tokens,
            scale=self.scale,
            rope_table=table,
            neox=bool(self.rope is None or self.rope.is_neox_style),
        )

    def do_kv_cache_update(
        self, layer: Any, key: Tensor, value: Tensor, kv_cache: Tensor, slot_mapping: Tensor
    ) -> None:
        native.store_kv(key, value, kv_cache, slot_mapping.long())


class SinkWindowCpuBackend(AttentionBackend):  # type: ignore[misc]
    """Sinks + window attention by a C++ kernel over vLLM's CPU cache (float32, either layout)."""

    forward_includes_kv_cache_update = False
    packs_sink_query: ClassVar[bool] = True  # the sinks are scored with the query at its in-cache position
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float32]
    supported_kv_cache_dtypes: ClassVar[list[Any]] = ["auto", "float32"]

    @staticmethod
    def get_name() -> str:
        return CPU_BACKEND_NAME

    @staticmethod
    def get_impl_cls() -> type[SinkWindowCpuImpl]:
        return SinkWindowCpuImpl

    @staticmethod
    def get_builder_cls() -> type[SinkWindowCpuBuilder]:
        return SinkWindowCpuBuilder

    @classmethod
    def supports_sliding_window(cls) -> bool:
        return True


def usable(head_size: int, dtype: torch.dtype, kv_cache_dtype: str) -> bool:
    """Whether the kernel serves a layer: float32 model and cache, a head size it is built for, and it builds."""
    return (
        dtype == torch.float32
        and kv_cache_dtype in ("auto", "float32")
        and native.head_size_supported(head_size)
        and native.available()
    )
