"""vLLM's own models (Llama, Llama 3, Mistral, Qwen2, Qwen3) with sinks + window attention layers.

vLLM's attention kernels know a sliding window but not sinks beside it, and score every key
with one rotated query. Sinks need a second query rotation (the query at its in-cache
position, see ``positions.py``). So each of vLLM's model classes is built as vLLM builds it
(its loaders, linear layers, quantization and tensor parallelism unchanged), then in every
attention module two submodules are swapped:

- ``attn`` for ``SinkWindowAttention``, vLLM's attention layer run by the sinks + window
  backend (``attn_backend.py``), which also gets the model's RoPE: on CPU it relocates the
  sinks with it and runs one fused pass;
- ``rotary_emb`` for ``SinkWindowRope``, which rotates as the model's own does or, for a
  backend that scores the sinks in a pass of their own (CUDA's FlashAttention one, untested:
  no GPU has run it), also returns the query rotated at its in-cache position, packed as one
  ``[T, 2 * H * d]`` tensor.

The attention modules' own ``forward`` (q/k/v bias, Qwen3's q/k norm, ...) runs unchanged
between the two. Enabled by ``hf_overrides`` naming ``sink_window_arch(arch)`` with
``metronome_window`` and ``metronome_sinks``.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn
from vllm.model_executor.layers.attention import Attention
from vllm.model_executor.layers.rotary_embedding.base import RotaryEmbeddingBase
from vllm.model_executor.models.llama import LlamaForCausalLM
from vllm.model_executor.models.mistral import MistralForCausalLM
from vllm.model_executor.models.qwen2 import Qwen2ForCausalLM
from vllm.model_executor.models.qwen3 import Qwen3ForCausalLM
from vllm.v1.attention.backend import AttentionType
from vllm.v1.kv_cache_interface import get_kv_quant_mode

from .attention import Rotate
from .kv_spec import SinkWindowSpec
from .positions import in_cache_positions
from .selector import select_backend

__all__ = [
    "SinkWindowAttention",
    "SinkWindowLlamaForCausalLM",
    "SinkWindowMistralForCausalLM",
    "SinkWindowQwen2ForCausalLM",
    "SinkWindowQwen3ForCausalLM",
    "SinkWindowRope",
]


class SinkWindowAttention(Attention):  # type: ignore[misc]
    """vLLM's attention layer, run by a sinks + window backend (``attn_backend.py``).

    Its KV cache spec is ``SinkWindowSpec`` (full-attention pages; blocks between the sinks
    and the window are freed by ``SinkWindowManager``). With sinks it takes the packed query
    of ``SinkWindowRope`` where its backend wants one; its output keeps vLLM's shape
    (``[T, H * d]``, from the token count).
    """

    def __init__(self, *args: Any, window: int, sinks: int, **kwargs: Any) -> None:
        from vllm.config import get_current_vllm_config

        config = get_current_vllm_config()
        head_size = args[1] if len(args) > 1 else kwargs["head_size"]
        backend = select_backend(head_size, config.model_config.dtype, config.cache_config.cache_dtype)
        super().__init__(*args, per_layer_sliding_window=window, attn_backend=backend, sink_tokens=sinks, **kwargs)
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


class SinkWindowRope(nn.Module):
    """The model's rotary embedding, called as the attention modules call theirs
    (``q, k = rotary_emb(positions, q, k)``).

    With ``pack`` (a backend that scores the sinks in a pass of their own) it also rotates
    the query to its in-cache position and returns ``cat(q at stream index, q at in-cache
    position)`` on the last axis; otherwise it rotates as the model's own does (the backend
    relocates the sinks instead).
    """

    def __init__(self, rope: nn.Module, *, window: int, sinks: int, pack: bool) -> None:
        super().__init__()
        self.rope = rope
        self.window = window
        self.sinks = sinks
        self.pack = pack and sinks > 0

    def forward(self, positions: Tensor, query: Tensor, key: Tensor) -> tuple[Tensor, Tensor]:
        if not self.pack:
            q, k = self.rope(positions, query, key)
            return q, k
        at = in_cache_positions(positions, window=self.window, sinks=self.sinks)
        # rotary embedding works in place on CPU: rotate a copy (with a copy of the key: vLLM's
        # CPU rotary kernel crashed on a query of a few rows and no key)
        q_sink, _ = self.rope(at, query.clone(), key.clone())
        q, k = self.rope(positions, query.contiguous(), key.contiguous())
        return torch.cat((q, q_sink), dim=-1), k


def rotation(rope: Any) -> Rotate:
    """``rope`` as ``attention.Rotate``: ``x [N, heads, d]`` rotated on by ``positions [N]`` (a copy)."""

    def rotate(positions: Tensor, x: Tensor) -> Tensor:
        # torch ops: vLLM's CPU rotary kernel crashed here on a query of a few rows and no key
        out, _ = rope.forward_native(positions, x.reshape(x.shape[0], -1), None)
        return out.view_as(x)  # type: ignore[no-any-return]

    return rotate


def _scales_frequencies(rope: Any) -> bool:
    """Whether ``rope``'s table is ``cos/sin(position * frequency)`` (plain, Llama 3), so that a
    rotation by ``a`` then by ``b`` is one by ``a + b``."""
    return type(rope)._compute_cos_sin_cache is RotaryEmbeddingBase._compute_cos_sin_cache


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
    if not _scales_frequencies(rope):
        raise ValueError(
            f"{type(rope).__name__} scales positions itself; the sinks + window backend can extend only "
            f"RoPE tables that scale frequencies (plain, Llama 3). Set max_model_len <= {rope.cos_sin_cache.shape[0]}"
        )
    inv_freq = rope._compute_inv_freq(rope.base).to(torch.float64)
    freqs = torch.outer(torch.arange(length, dtype=torch.float64), inv_freq)
    cache = torch.cat((freqs.cos(), freqs.sin()), dim=-1)
    rope.cos_sin_cache = cache.to(device=rope.cos_sin_cache.device, dtype=rope.cos_sin_cache.dtype)
    rope.max_position_embeddings = length


def swap_attention_layers(model: nn.Module, *, window: int, sinks: int, vllm_config: Any) -> int:
    """In every attention module of ``model`` (one holding ``attn`` and ``rotary_emb``), swap both
    for the sinks + window ones. Returns how many modules were swapped."""
    forward_context = vllm_config.compilation_config.static_forward_context
    length = int(vllm_config.model_config.max_model_len)
    swapped = 0
    for module in list(model.modules()):
        old = getattr(module, "attn", None)
        rope = getattr(module, "rotary_emb", None)
        if not isinstance(old, Attention) or rope is None or isinstance(old, SinkWindowAttention):
            continue
        if old.attn_type != AttentionType.DECODER or old.sliding_window is not None:
            raise ValueError(
                f"{old.layer_name} is a {old.attn_type} attention layer with sliding_window={old.sliding_window}; "
                "the sinks + window backend replaces full causal decoder attention only"
            )
        name = old.layer_name
        # the stock layer registered itself under this name: the sinks + window one takes it over
        del forward_context[name]
        module.attn = SinkWindowAttention(
            old.num_heads,
            old.head_size,
            old.impl.scale,
            num_kv_heads=old.num_kv_heads,
            cache_config=vllm_config.cache_config,
            quant_config=old.quant_config,
            prefix=name,
            window=window,
            sinks=sinks,
        )
        extend_rope(rope, length)
        backend = module.attn.attn_backend
        pack = backend.packs_sink_query
        if pack and hasattr(module.attn.impl, "rope") and _scales_frequencies(rope):
            module.attn.impl.rope = rope  # the CPU kernel rotates the sink query back itself
            pack = False
        module.rotary_emb = SinkWindowRope(rope, window=window, sinks=sinks, pack=pack)
        module.attn.impl.rotate = rotation(rope)
        swapped += 1
    if not swapped:
        raise ValueError(f"{type(model).__name__} has no attention module with attn and rotary_emb to swap")
    return swapped


def _sink_window_model(base: type[nn.Module]) -> type[nn.Module]:
    """``base`` (one of vLLM's model classes) built as vLLM builds it, then its attention swapped."""

    def __init__(self: nn.Module, *, vllm_config: Any, prefix: str = "") -> None:
        base.__init__(self, vllm_config=vllm_config, prefix=prefix)  # type: ignore[call-arg]
        config = vllm_config.model_config.hf_config
        swap_attention_layers(
            self, window=int(config.metronome_window), sinks=int(config.metronome_sinks), vllm_config=vllm_config
        )

    name = f"SinkWindow{base.__name__}"
    doc = f"vLLM's ``{base.__name__}`` with sinks + window attention layers (same weights, same names)."
    return type(name, (base,), {"__init__": __init__, "__doc__": doc, "__module__": __name__})


# registered by ``plugin.register`` under ``plugin.sink_window_arch`` of their base's name
SinkWindowLlamaForCausalLM = _sink_window_model(LlamaForCausalLM)
SinkWindowMistralForCausalLM = _sink_window_model(MistralForCausalLM)
SinkWindowQwen2ForCausalLM = _sink_window_model(Qwen2ForCausalLM)
SinkWindowQwen3ForCausalLM = _sink_window_model(Qwen3ForCausalLM)
