"""A Llama whose attention keeps the first ``S`` and the last ``W`` tokens, as the torch runner does.

vLLM's attention kernels know a sliding window but not sinks beside it, and score every key
with one rotated query. Sinks need a second query rotation (the query at its in-cache
position, see ``positions.py``), so each layer rotates the query twice and hands both to a
sinks + window attention backend (``attn_backend.py``) through vLLM's own attention op:
a sliding-window pass and a sink pass, merged by log-sum-exp. The rest of the model
(weights, MLP, norms, sampling, scheduling) is vLLM's own Llama. Enabled by ``hf_overrides`` naming
``SINK_WINDOW_ARCH`` with ``metronome_window`` and ``metronome_sinks``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor
from vllm.config import get_current_vllm_config
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbeddingBase
from vllm.model_executor.models.llama import LlamaAttention, LlamaDecoderLayer, LlamaForCausalLM
from vllm.v1.kv_cache_interface import get_kv_quant_mode

from .attn_backend import select_backend
from .kv_spec import SinkWindowSpec
from .positions import in_cache_positions

__all__ = ["SinkWindowAttention", "SinkWindowLlamaForCausalLM"]


class SinkWindowAttention(Attention):  # type: ignore[misc]
    """vLLM's attention layer, run by a sinks + window backend (``attn_backend.py``).

    Its KV cache spec is ``SinkWindowSpec`` (full-attention pages; blocks between the sinks
    and the window are freed by ``SinkWindowManager``).
    """

    def __init__(self, *args: Any, window: int, sinks: int, **kwargs: Any) -> None:
        super().__init__(
            *args, per_layer_sliding_window=window, attn_backend=select_backend(), sink_tokens=sinks, **kwargs
        )
        self.window = window
        self.sinks = sinks

    def get_kv_cache_spec(self, vllm_config: Any) -> SinkWindowSpec:
        return SinkWindowSpec(
            block_size=vllm_config.cache_config.block_size,
            num_kv_heads=self.num_kv_heads,
            head_size=self.head_size,
            head_size_v=self.head_size_v,
            dtype=self.kv_cache_torch_dtype,
            kv_quant_mode=get_kv_quant_mode(self.kv_cache_dtype),
            window=self.window,
            sinks=self.sinks,
        )


def extend_rope(rope: Any, length: int) -> None:
    """Give a RoPE table ``length`` positions, computed in float64 (idempotent).

    Keys are cached rotated at their stream index, so a stream past the trained length needs
    angles past the trained table; attention only ever sees distances up to ``S + W`` (the
    window at stream positions, the sinks at in-cache positions), which the model was
    trained on. float64 angles keep ``cos/sin`` exact to the cache dtype at any index, so a
    relative angle at index 100,000 is as exact as at index 10 (fp32 angles would drift
    by ~1e-3 rad there).
    """
    if rope.cos_sin_cache.shape[0] >= length:
        return
    if type(rope)._compute_cos_sin_cache is not RotaryEmbeddingBase._compute_cos_sin_cache:
        raise ValueError(
            f"{type(rope).__name__} scales positions itself; the sinks + window backend can extend only plain "
            f"RoPE tables (Llama, Llama 3). Set max_model_len <= {rope.cos_sin_cache.shape[0]}"
        )
    inv_freq = rope._compute_inv_freq(rope.base).to(torch.float64)
    freqs = torch.outer(torch.arange(length, dtype=torch.float64), inv_freq)
    cache = torch.cat((freqs.cos(), freqs.sin()), dim=-1)
    rope.cos_sin_cache = cache.to(device=rope.cos_sin_cache.device, dtype=rope.cos_sin_cache.dtype)
    rope.max_position_embeddings = length


class SinkWindowLlamaAttention(LlamaAttention):  # type: ignore[misc]
    """Llama attention that also rotates the query to its in-cache position for the sinks."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        config = kwargs["config"]
        self.window = int(config.metronome_window)
        self.sinks = int(config.metronome_sinks)
        vllm_config = get_current_vllm_config()
        # LlamaAttention built a stock Attention under this name: replace it by the sinks + window one
        old: Any = self._modules["attn"]  # nn.Module keeps submodules here
        name = old.layer_name
        del vllm_config.compilation_config.static_forward_context[name]
        self.attn = SinkWindowAttention(
            old.num_heads,
            old.head_size,
            old.impl.scale,
            num_kv_heads=old.num_kv_heads,
            cache_config=kwargs.get("cache_config"),
            quant_config=kwargs.get("quant_config"),
            prefix=name,
            window=self.window,
            sinks=self.sinks,
        )
        extend_rope(self.rotary_emb, int(vllm_config.model_config.max_model_len))

    def forward(self, positions: Tensor, hidden_states: Tensor) -> Tensor:
        qkv, _ = self.qkv_proj(hidden_states)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q_sink: Tensor | None = None
        if self.sinks:
            at = in_cache_positions(positions, window=self.window, sinks=self.sinks)
            # rotary embedding works in place on CPU: rotate a copy
            q_sink, _ = self.rotary_emb(at, q.clone(), None)
        q, k = self.rotary_emb(positions, q.contiguous(), k.contiguous())
        # the backend takes both rotations of the query as one [T, 2 * H * d] tensor
        packed = q if q_sink is None else torch.cat((q, q_sink), dim=-1)
        out = self.attn(packed, k, v, output_shape=torch.Size((q.shape[0], self.q_size)))
        output, _ = self.o_proj(out)
        return output  # type: ignore[no-any-return]


class SinkWindowDecoderLayer(LlamaDecoderLayer):  # type: ignore[misc]
    def __init__(self, vllm_config: Any, prefix: str = "", config: Any = None) -> None:
        super().__init__(vllm_config, prefix, config, attn_layer_type=SinkWindowLlamaAttention)


class SinkWindowLlamaForCausalLM(LlamaForCausalLM):  # type: ignore[misc]
    """vLLM's Llama with sinks + window attention layers (same weights, same names)."""

    def __init__(self, *, vllm_config: Any, prefix: str = "") -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix, layer_type=SinkWindowDecoderLayer)
