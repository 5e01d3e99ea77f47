"""The sinks + window attention as vLLM attention backends, run inside vLLM's attention op.

The layers call vLLM's ``unified_attention_with_output`` custom op like any attention layer,
so vLLM's compilation and CUDA graphs treat them as it treats its own; the op calls the
``forward`` of the backend's implementation below. Two backends, one scheme (``attention.py``):

- ``SinkWindowTorchBackend`` (any device; on CPU where ``cpu_backend``'s C++ kernel does not
  serve the layer: not float32, or no compiler): one fused pass
  (``attention.sink_window_attention``): each tile of queries gathers its sink blocks and
  window span once, relocates the sinks per query row with the model's RoPE (so the query
  rotated at its stream index scores them as at its in-cache position), and runs torch's
  fused attention kernel (on CPU its flash-attention kernel) over the masked columns: no
  second pass, no merge. The tiles are built once per step by its metadata builder; the
  layer hands it the plain query and its rotation.
- ``SinkWindowFlashBackend`` (CUDA): the window part is FlashAttention's paged varlen kernel
  with ``window_size=(W-1, 0)`` and ``return_softmax_lse=True``, then the sink part
  (``attention.sink_pass``, with the query rotated at its in-cache position) merged with
  vLLM's ``merge_attn_states``. FlashAttention's metadata builder, extended with the sink
  pass's index (``attention.SinkIndex``, built once per step for every layer); its shapes
  follow the batch, so attention runs between vLLM's CUDA graphs (piecewise capture), not
  inside full ones. Written against vLLM 0.32's API; untested: no GPU has run it
  (``scripts/gpu_check.sh`` is the first-contact check). Its Python (``flash_forward``) runs
  on CPU in the tests, with torch stand-ins for the CUDA kernels.

For the Flash backend the query comes packed (``packs_sink_query``): ``[T, 2 * H, d]`` holds
the query rotated at its stream index (heads ``:H``) and at its in-cache position (heads
``H:``), so the op's signature stays vLLM's. Without sinks it is the plain ``[T, H, d]`` query.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Generic, TypeVar

import torch
from torch import Tensor
from vllm.utils.torch_utils import canonicalize_singleton_dim_strides
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionCGSupport,
    AttentionImpl,
    AttentionMetadataBuilder,
    AttentionType,
    CommonAttentionMetadata,
)
from vllm.v1.attention.ops.merge_attn_states import merge_attn_states

from .attention import Rotate, SinkIndex, WindowTiles, count_tiles, sink_pass, sink_window_attention, write_kv
from .checks import check_kv_cache_dtype

__all__ = ["SinkWindowFlashBackend", "SinkWindowTorchBackend"]

TORCH_BACKEND_NAME = "METRONOME_SINK_WINDOW_TORCH"
FLASH_BACKEND_NAME = "METRONOME_SINK_WINDOW_FLASH"


def split_query(query: Tensor, num_tokens: int, num_heads: int, sinks: int) -> tuple[Tensor, Tensor | None]:
    if not sinks:
        return query[:num_tokens], None
    # the layer views the packed [T, 2 * H * d] query as [2T, H, d]: token t's rows are 2t and 2t + 1
    packed = query.view(-1, 2 * num_heads, query.shape[-1])
    return packed[:num_tokens, :num_heads], packed[:num_tokens, num_heads:]


# ``merge_attn_states(output, prefix_output, prefix_lse, suffix_output, suffix_lse)``, vLLM's signature
Merge = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor], None]
# FlashAttention's paged varlen kernel, called with ``flash_attn_varlen_func``'s keywords: ``(out, lse)``
VarlenAttention = Callable[..., Any]


def merge_sinks(
    output: Tensor,
    out_w: Tensor,
    lse_w: Tensor,
    q_sink: Tensor | None,
    kv_cache: Tensor,
    index: SinkIndex | None,
    *,
    scale: float,
    merge: Merge = merge_attn_states,
) -> None:
    """Add the sink part to the window part (both already computed) by log-sum-exp; write ``output``."""
    n = out_w.shape[0]
    if q_sink is None:
        output[:n].copy_(out_w)
        return
    if index is None:
        raise ValueError("a sink query needs the step's SinkIndex (built by the metadata builder)")
    out_s, lse_s = sink_pass(q_sink, kv_cache, index, scale=scale)
    merge(output[:n], out_w, lse_w, out_s.to(out_w.dtype), lse_s)  # lse: float32 [H, T] both


def sink_index_for(cm: CommonAttentionMetadata, *, block_size: int, window: int, sinks: int) -> SinkIndex | None:
    """The step's sink index (``None`` without sinks), built once per step for every layer of a group."""
    if not sinks:
        return None
    return SinkIndex.build(
        cm.query_start_loc,
        cm.seq_lens,
        cm.block_table_tensor,
        num_tokens=cm.num_actual_tokens,
        max_query_len=cm.max_query_len,
        block_size=block_size,
        window=window,
        sinks=sinks,
        # the tile count from the host copy: no device sync in the builder
        num_tiles=count_tiles(cm.query_start_loc_cpu, cm.max_query_len),
    )


def flash_forward(
    impl: Any,
    layer: Any,
    query: Tensor,
    kv_cache: Tensor,
    md: Any,
    output: Tensor,
    *,
    varlen: VarlenAttention,
    merge: Merge = merge_attn_states,
) -> Tensor:
    """``SinkWindowFlashImpl.forward``'s work: FlashAttention's window pass, the sink pass, their merge.

    ``varlen`` and ``merge`` are FlashAttention's kernel and vLLM's merge on CUDA; a CPU test
    passes torch equivalents, so the bookkeeping here runs without a GPU (the CUDA kernels
    themselves are untested: no GPU has run them).
    """
    n = md.num_actual_tokens
    q, q_sink = split_query(query, n, impl.num_heads, impl.sink_tokens)
    # (B, H, N, 2*D) -> ((B, N, H, D), (B, N, H, D)): the view's strides carry the layout
    key_cache, value_cache = kv_cache.transpose(1, 2).split(impl.head_size, dim=-1)  # type: ignore[no-untyped-call]
    # one KV head per GPU (tensor parallel) leaves a size-1 head axis with any stride; FlashAttention's
    # TMA path (FA3 on H100+) needs canonical ones: the fix vLLM's own forward applies after this transpose
    key_cache = canonicalize_singleton_dim_strides(key_cache)
    value_cache = canonicalize_singleton_dim_strides(value_cache)
    out_w = torch.empty_like(output[:n])
    descale = (md.query_start_loc.shape[0] - 1, impl.num_kv_heads)
    _, lse_w = varlen(
        q=q,
        k=key_cache,
        v=value_cache,
        out=out_w,
        cu_seqlens_q=md.query_start_loc,
        max_seqlen_q=md.max_query_len,
        seqused_k=md.seq_lens,
        max_seqlen_k=md.max_seq_len,
        softmax_scale=impl.scale,
        causal=True,
        window_size=list(impl.sliding_window),
        block_table=md.block_table,
        softcap=impl.logits_soft_cap,
        return_softmax_lse=True,
        scheduler_metadata=md.scheduler_metadata,
        fa_version=impl.vllm_flash_attn_version,
        k_descale=layer._k_scale.expand(descale),
        v_descale=layer._v_scale.expand(descale),
        num_splits=md.max_num_splits,
    )
    merge_sinks(output, out_w, lse_w, q_sink, kv_cache, md.sink_index, scale=impl.scale, merge=merge)
    return output


# the torch backend (CPU, or any device) ---------------------------------------------------------


@dataclass
class SinkWindowTorchMetadata:
    num_actual_tokens: int
    query_start_loc: Tensor
    seq_lens: Tensor
    block_table: Tensor
    slot_mapping: Tensor
    tiles: WindowTiles


class SinkWindowTorchBuilder(AttentionMetadataBuilder[SinkWindowTorchMetadata]):  # type: ignore[misc]
    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.NEVER

    def __init__(self, kv_cache_spec: Any, layer_names: list[str], vllm_config: Any, device: torch.device) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        self.window = int(kv_cache_spec.window)
        self.sinks = int(kv_cache_spec.sinks)
        self.dtype = vllm_config.model_config.dtype

    def build(
        self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata, fast_build: bool = False
    ) -> SinkWindowTorchMetadata:
        del common_prefix_len, fast_build
        cm = common_attn_metadata
        n = cm.num_actual_tokens
        tiles = WindowTiles.build(
            cm.query_start_loc,
            cm.seq_lens,
            cm.block_table_tensor,
            num_tokens=n,
            max_query_len=cm.max_query_len,
            max_seq_len=cm.max_seq_len,
            block_size=self.kv_cache_spec.block_size,
            window=self.window,
            sinks=self.sinks,
            dtype=self.dtype,
        )
        return SinkWindowTorchMetadata(
            num_actual_tokens=n,
            query_start_loc=cm.query_start_loc,
            seq_lens=cm.seq_lens,
            block_table=cm.block_table_tensor,
            slot_mapping=cm.slot_mapping,
            tiles=tiles,
        )


M = TypeVar("M")


class SinkWindowImpl(AttentionImpl[M], Generic[M]):  # type: ignore[misc]
    """What the CPU backends share: the layer's settings, the cache write, and ``forward``'s
    refusals and profiling guard; each backend gives only its attention (``_attend``)."""

    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: int | None = None,
        alibi_slopes: list[float] | None = None,
        sliding_window: int | None = None,
        kv_cache_dtype: str = "auto",
        logits_soft_cap: float | None = None,
        attn_type: str = AttentionType.DECODER,
        kv_sharing_target_layer_name: str | None = None,
        *,
        sink_tokens: int = 0,
    ) -> None:
        if sliding_window is None:
            raise ValueError("the sinks + window attention needs a window")
        if alibi_slopes is not None or logits_soft_cap or kv_sharing_target_layer_name is not None:
            raise ValueError("the sinks + window attention supports no alibi, soft cap or KV sharing")
        check_kv_cache_dtype(kv_cache_dtype)
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = float(scale)
        self.num_kv_heads = num_kv_heads or num_heads
        self.window = int(sliding_window)
        self.sink_tokens = int(sink_tokens)
        self.kv_cache_dtype = kv_cache_dtype
        self.attn_type = attn_type
        self.rotate: Rotate | None = None  # the model's RoPE, set by model.swap_attention_layers

    def do_kv_cache_update(
        self, layer: Any, key: Tensor, value: Tensor, kv_cache: Tensor, slot_mapping: Tensor
    ) -> None:
        write_kv(kv_cache, key, value, slot_mapping)

    def forward(
        self,
        layer: Any,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        kv_cache: Tensor,
        attn_metadata: M | None,
        output: Tensor,
        output_scale: Tensor | None = None,
        output_block_scale: Tensor | None = None,
    ) -> Tensor:
        if output_scale is not None or output_block_scale is not None:
            raise NotImplementedError("fused output quantization is not supported by the sinks + window attention")
        if attn_metadata is None:  # the profiling run
            return output.zero_()
        self._attend(query, kv_cache, attn_metadata, output)
        return output

    @abstractmethod
    def _attend(self, query: Tensor, kv_cache: Tensor, md: M, output: Tensor) -> None:
        """Write the attention of the step's tokens into ``output[:md.num_actual_tokens]``."""


class SinkWindowTorchImpl(SinkWindowImpl[SinkWindowTorchMetadata]):
    def _attend(self, query: Tensor, kv_cache: Tensor, md: SinkWindowTorchMetadata, output: Tensor) -> None:
        n = md.num_actual_tokens
        out, _ = sink_window_attention(query[:n], kv_cache, md.tiles, scale=self.scale, rotate=self.rotate)
        output[:n].copy_(out)


class SinkWindowTorchBackend(AttentionBackend):  # type: ignore[misc]
    """Sinks + window attention in batched torch ops over any KV cache layout."""

    forward_includes_kv_cache_update = False
    packs_sink_query: ClassVar[bool] = False  # relocates the sinks itself: the layer passes the plain query
    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16, torch.float32]
    supported_kv_cache_dtypes: ClassVar[list[Any]] = ["auto", "float16", "bfloat16", "float32"]

    @staticmethod
    def get_name() -> str:
        return TORCH_BACKEND_NAME

    @staticmethod
    def get_impl_cls() -> type[SinkWindowTorchImpl]:
        return SinkWindowTorchImpl

    @staticmethod
    def get_builder_cls() -> type[SinkWindowTorchBuilder]:
        return SinkWindowTorchBuilder

    @classmethod
    def supports_sliding_window(cls) -> bool:
        return True


# the CUDA backend: FlashAttention for the window part ------------------------------------------


def _flash_backend() -> type[AttentionBackend]:
    """Built on first use: vLLM's FlashAttention kernels exist on CUDA only (the classes import anywhere)."""
    from vllm.v1.attention.backends import fa_utils
    from vllm.v1.attention.backends.flash_attn import (
        FlashAttentionBackend,
        FlashAttentionImpl,
        FlashAttentionMetadata,
        FlashAttentionMetadataBuilder,
    )

    @dataclass
    class SinkWindowFlashMetadata(FlashAttentionMetadata):  # type: ignore[misc]
        sink_index: SinkIndex | None = None  # the sink pass's index work, once per step for every layer

    class SinkWindowFlashBuilder(FlashAttentionMetadataBuilder):  # type: ignore[misc]
        # the sink index's shapes follow the batch (its tiles), so a full CUDA graph would replay stale
        # tensors: attention runs between the graphs (vLLM falls back to piecewise capture)
        _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.NEVER
        supports_update_block_table: bool = False  # the sink index holds block ids read from the table
        metadata_cls: ClassVar[type[SinkWindowFlashMetadata]] = SinkWindowFlashMetadata

        def __init__(self, kv_cache_spec: Any, layer_names: list[str], vllm_config: Any, device: Any) -> None:
            super().__init__(kv_cache_spec, layer_names, vllm_config, device)
            self.window = int(kv_cache_spec.window)
            self.sinks = int(kv_cache_spec.sinks)

        @classmethod
        def get_cudagraph_support(cls, vllm_config: Any, kv_cache_spec: Any) -> AttentionCGSupport:
            return cls._cudagraph_support

        def build(
            self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata, fast_build: bool = False
        ) -> SinkWindowFlashMetadata:
            md = super().build(common_prefix_len, common_attn_metadata, fast_build)
            index = sink_index_for(
                common_attn_metadata, block_size=self.block_size, window=self.window, sinks=self.sinks
            )
            return self.metadata_cls(**{f.name: getattr(md, f.name) for f in fields(md)}, sink_index=index)

    class SinkWindowFlashImpl(FlashAttentionImpl):  # type: ignore[misc]
        def __init__(self, *args: Any, sink_tokens: int = 0, **kwargs: Any) -> None:
            # before FlashAttention's own checks: its message would not say the sinks are the reason
            check_kv_cache_dtype(str(kwargs.get("kv_cache_dtype", args[6] if len(args) > 6 else "auto")))
            super().__init__(*args, **kwargs)
            if self.sliding_window[0] < 0:
                raise ValueError("the sinks + window attention needs a window")
            self.window = self.sliding_window[0] + 1
            self.sink_tokens = int(sink_tokens)
            # the CUDA kernels (vLLM has no FlashAttention where it has no CUDA); the CPU tests set torch stand-ins
            self.varlen: VarlenAttention | None = getattr(fa_utils, "flash_attn_varlen_func", None)
            self.merge: Merge = merge_attn_states

        def forward(
            self,
            layer: Any,
            query: Tensor,
            key: Tensor,
            value: Tensor,
            kv_cache: Tensor,
            attn_metadata: Any,
            output: Tensor,
            output_scale: Tensor | None = None,
            output_block_scale: Tensor | None = None,
        ) -> Tensor:
            if output_scale is not None or output_block_scale is not None:
                raise NotImplementedError("fused output quantization is not supported by the sinks + window attention")
            if attn_metadata is None:
                return output.fill_(0)
            if self.varlen is None:
                raise RuntimeError("the sinks + window FlashAttention backend runs on CUDA only")
            return flash_forward(
                self, layer, query, kv_cache, attn_metadata, output, varlen=self.varlen, merge=self.merge
            )

    class SinkWindowFlashBackend(FlashAttentionBackend):  # type: ignore[misc]
        packs_sink_query: ClassVar[bool] = True  # the sink pass wants the query at its in-cache position
        # the sink pass reads the cache as values: no fp8 scales applied there (checks.py)
        supported_kv_cache_dtypes: ClassVar[list[Any]] = ["auto", "float16", "bfloat16"]

        @staticmethod
        def get_name() -> str:
            return FLASH_BACKEND_NAME

        @staticmethod
        def get_impl_cls() -> type[SinkWindowFlashImpl]:
            return SinkWindowFlashImpl

        @staticmethod
        def get_builder_cls() -> type[SinkWindowFlashBuilder]:
            return SinkWindowFlashBuilder

    return SinkWindowFlashBackend


_flash: type[AttentionBackend] | None = None


def SinkWindowFlashBackend() -> type[AttentionBackend]:
    global _flash
    if _flash is None:
        _flash = _flash_backend()
    return _flash


def register_backends() -> None:
    """Name both backends in vLLM's registry (its layers look their backend up by name)."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    for name, path in (
        (TORCH_BACKEND_NAME, f"{__name__}.SinkWindowTorchBackend"),
        ("METRONOME_SINK_WINDOW_CPU", f"{__package__}.cpu_backend.SinkWindowCpuBackend"),
        (FLASH_BACKEND_NAME, f"{__name__}._flash_backend_class"),
    ):
        if name not in AttentionBackendEnum.__members__:
            register_backend(name, path)


def __getattr__(name: str) -> Any:
    if name == "_flash_backend_class":  # the registry imports a class path: resolve the CUDA one lazily
        return SinkWindowFlashBackend()
    raise AttributeError(name)
