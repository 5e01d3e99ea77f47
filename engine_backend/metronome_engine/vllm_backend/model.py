"""A Llama whose attention keeps the first ``S`` and the last ``W`` tokens, as the torch runner does.

vLLM's attention kernels know a sliding window but not sinks beside it, and score every key
with one rotated query. Sinks need a second query rotation (the query at its in-cache
position, see ``positions.py``), so these layers compute attention themselves over the
paged KV cache vLLM allocated for them: gather the sink and window slots of each request
through its block table, score, mask, softmax. The rest of the model (weights, MLP, norms,
sampling, scheduling) is vLLM's own Llama. Enabled by ``hf_overrides`` naming
``SINK_WINDOW_ARCH`` with ``metronome_window`` and ``metronome_sinks``.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

import torch
from torch import Tensor
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.layers.attention.attention import get_attention_context
from vllm.model_executor.models.llama import LlamaAttention, LlamaDecoderLayer, LlamaForCausalLM

from .kv_spec import SinkWindowSpec
from .positions import in_cache_positions, visible

__all__ = ["SinkWindowAttention", "SinkWindowLlamaForCausalLM"]


class SinkWindowAttention(Attention):  # type: ignore[misc]
    """vLLM's attention layer (its KV cache and metadata) with the sinks + window scoring."""

    window: int
    sinks: int

    def get_kv_cache_spec(self, vllm_config: Any) -> SinkWindowSpec:
        base = super().get_kv_cache_spec(vllm_config)
        return SinkWindowSpec(
            **{f.name: getattr(base, f.name) for f in fields(base)}, window=self.window, sinks=self.sinks
        )

    def attend(self, q: Tensor, q_sink: Tensor | None, k: Tensor, v: Tensor) -> Tensor:
        """``[T, H * hd]`` attention output; writes this step's K/V into the layer's cache first."""
        heads, kv_heads, hd = self.num_heads, self.num_kv_heads, self.head_size
        out = q.new_zeros(q.shape[0], heads * hd)
        try:
            md, _, kv_cache, slot_mapping = get_attention_context(self.layer_name)
        except KeyError:
            md = None
        if md is None:  # the profiling and warm-up runs carry no metadata
            return out
        n = int(md.num_actual_tokens)
        cache, block_size = _slot_view(kv_cache, kv_heads, hd)
        slots = (slot_mapping if slot_mapping is not None else md.slot_mapping)[:n].long()
        cache[slots, 0] = k[:n].reshape(n, kv_heads, hd).to(cache.dtype)
        cache[slots, 1] = v[:n].reshape(n, kv_heads, hd).to(cache.dtype)
        starts = md.query_start_loc.tolist()
        lengths = md.seq_lens.tolist()
        table = md.block_table
        group = heads // kv_heads
        for r, length in enumerate(lengths):
            a, b = int(starts[r]), int(starts[r + 1])
            if b <= a:
                continue
            t0 = int(length) - (b - a)
            n_sinks = min(self.sinks, int(length))
            lo = min(max(self.sinks, t0 - self.window + 1), int(length))  # a stream shorter than S has no window yet
            k_pos = torch.cat([torch.arange(0, n_sinks), torch.arange(lo, int(length))]).to(table.device)
            rows = table[r, k_pos // block_size].long() * block_size + k_pos % block_size
            keys = cache[rows, 0].to(q.dtype)  # [m, kvh, hd]
            values = cache[rows, 1].to(q.dtype)
            qr = q[a:b].reshape(b - a, kv_heads, group, hd)
            scores = torch.einsum("qhgd,mhd->hgqm", qr, keys)
            if q_sink is not None and n_sinks:
                qs = q_sink[a:b].reshape(b - a, kv_heads, group, hd)
                scores[..., :n_sinks] = torch.einsum("qhgd,mhd->hgqm", qs, keys[:n_sinks])
            q_pos = torch.arange(t0, int(length), device=table.device)
            allowed = visible(q_pos, k_pos, window=self.window, sinks=self.sinks)
            scores = (scores * self.impl.scale).masked_fill(~allowed, float("-inf"))
            probs = torch.softmax(scores.float(), dim=-1).to(values.dtype)
            out[a:b] = torch.einsum("hgqm,mhd->qhgd", probs, values).reshape(b - a, heads * hd)
        return out


def _slot_view(kv_cache: Tensor, kv_heads: int, head_dim: int) -> tuple[Tensor, int]:
    """The layer's cache as ``[slots, 2, kvh, hd]`` and the kernel block size of its slot ids.

    Only these layers read or write this memory, so its layout is theirs; the block size
    is dim 2 in both vLLM layouts met (``[nb, kvh, bs, 2*hd]`` on CPU, ``[2, nb, bs, kvh, hd]``).
    """
    if not kv_cache.is_contiguous():
        raise RuntimeError(f"the sinks + window layers need a contiguous KV cache, got strides {kv_cache.stride()}")
    per_slot = 2 * kv_heads * head_dim
    if kv_cache.numel() % per_slot:
        raise RuntimeError(f"KV cache of shape {tuple(kv_cache.shape)} does not hold whole slots of {per_slot}")
    return kv_cache.view(-1, 2, kv_heads, head_dim), int(kv_cache.shape[2])


class SinkWindowLlamaAttention(LlamaAttention):  # type: ignore[misc]
    """Llama attention that also rotates the query to its in-cache position for the sinks."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        config = kwargs["config"]
        self.window = int(config.metronome_window)
        self.sinks = int(config.metronome_sinks)
        # the layer vLLM just built is registered under its name for KV allocation;
        # give that same object the sinks + window behaviour rather than build a second one
        self.attn.__class__ = SinkWindowAttention
        self.attn.window = self.window
        self.attn.sinks = self.sinks

    def forward(self, positions: Tensor, hidden_states: Tensor) -> Tensor:
        qkv, _ = self.qkv_proj(hidden_states)
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q_sink: Tensor | None = None
        if self.sinks:
            at = in_cache_positions(positions, window=self.window, sinks=self.sinks)
            # rotary embedding works in place on CPU: rotate a copy
            q_sink, _ = self.rotary_emb(at, q.clone(), None)
        q, k = self.rotary_emb(positions, q.contiguous(), k.contiguous())
        out = self.attn.attend(q, q_sink, k, v)
        output, _ = self.o_proj(out)
        return output  # type: ignore[no-any-return]


class SinkWindowDecoderLayer(LlamaDecoderLayer):  # type: ignore[misc]
    def __init__(self, vllm_config: Any, prefix: str = "", config: Any = None) -> None:
        super().__init__(vllm_config, prefix, config, attn_layer_type=SinkWindowLlamaAttention)


class SinkWindowLlamaForCausalLM(LlamaForCausalLM):  # type: ignore[misc]
    """vLLM's Llama with sinks + window attention layers (same weights, same names)."""

    def __init__(self, *, vllm_config: Any, prefix: str = "") -> None:
        super().__init__(vllm_config=vllm_config, prefix=prefix, layer_type=SinkWindowDecoderLayer)
