"""A compact Llama-family model that reads K/V from the paged block pool.

The families differ by a few options of ``ModelConfig``, each a step of the one layer
here: scaled RoPE frequencies (Llama 3), q/k/v and o biases (Qwen2, ``attention_bias``),
per-head q/k RMSNorm (Qwen3), an untied output head.

One forward pass serves a whole tick: the new tokens of every session are packed
into one ``[T, hidden]`` matrix for the dense layers; attention gathers each
session's resident K/V through its block table (see ``attention.py``).

Keys are stored rotated at their *stream* index. RoPE scores depend only on the
distance between query and key, and window tokens are contiguous, so a window key's
distance in the stream equals its distance in the cache. Only the sinks sit at a
different distance, so their scores use the query rotated at its *in-cache* position.
The result equals rotating every resident token at its cache position ``0..S+W-1``
(StreamingLLM) without re-rotating the cache each step.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .attention import AttentionBatch
from .batch_view import BatchView
from .config import ModelConfig
from .kv_cache import KVCache
from .quant import QuantBlocks, pack_groups, pack_tiles, tile_rows

if TYPE_CHECKING:
    from .kernels import KernelBuild
    from .paged import PagedBatch

__all__ = ["LlamaModel", "RopeTable", "rope_cos_sin", "rope_inv_freq", "apply_rope"]

log = logging.getLogger(__name__)

# the dense layers of a decoder layer, and the HF weights each one fuses (in this order)
_LINEARS = (
    ("qkv", ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")),
    ("o_proj", ("self_attn.o_proj",)),
    ("gate_up", ("mlp.gate_proj", "mlp.up_proj")),
    ("down_proj", ("mlp.down_proj",)),
)


def rope_inv_freq(config: ModelConfig) -> torch.Tensor:
    """RoPE's inverse frequencies (float32), scaled as ``config.rope_scaling`` says, as HF
    transformers computes them."""
    hd = config.head_dim
    inv = 1.0 / (config.rope_theta ** (torch.arange(0, hd, 2, dtype=torch.int64).float() / hd))
    scaling = config.rope_scaling
    if scaling is None:
        return inv
    if scaling.kind == "linear":
        return inv / scaling.factor
    old = scaling.original_max_position_embeddings
    low_wavelen = old / scaling.low_freq_factor
    high_wavelen = old / scaling.high_freq_factor
    wavelen = 2 * math.pi / inv
    scaled = torch.where(wavelen > low_wavelen, inv / scaling.factor, inv)
    smooth = (old / wavelen - scaling.low_freq_factor) / (scaling.high_freq_factor - scaling.low_freq_factor)
    smoothed = (1 - smooth) * scaled / scaling.factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def rope_cos_sin(inv_freq: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
    """cos/sin for integer positions, angles in float64 so that position 10**7 is as exact as 10."""
    angles = positions.to(torch.float64)[:, None] * inv_freq.to(torch.float64)[None, :]
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos().to(torch.float32), angles.sin().to(torch.float32)


class RopeTable:
    """RoPE's cos/sin for positions ``0 .. n - 1``, computed once by ``rope_cos_sin`` (each
    row is what it gives for that position, to the bit) and read by row: its float64 angles
    took about 45 us a step (seven small ops), two row gathers take about 10. Grows by
    doubling up to ``limit`` positions (8 MB at head_dim 64); a step with a position past
    that, or on another device than ``inv_freq``, computes its angles directly."""

    def __init__(self, limit: int = 1 << 14) -> None:
        self.limit = limit
        self._table = (torch.empty(0), torch.empty(0))

    @property
    def size(self) -> int:
        """Positions the table holds so far."""
        return int(self._table[0].shape[0])

    def __call__(self, inv_freq: Tensor, positions: Tensor) -> tuple[Tensor, Tensor]:
        top = int(positions.max()) if positions.numel() else 0
        if top >= self.limit or positions.device != inv_freq.device:
            return rope_cos_sin(inv_freq, positions)
        cos, sin = self._table
        if top >= cos.shape[0] or cos.device != inv_freq.device:
            size = max(1024, cos.shape[0])
            while size <= top:
                size *= 2
            cos, sin = rope_cos_sin(inv_freq, torch.arange(min(size, self.limit), device=inv_freq.device))
            self._table = (cos, sin)  # one assignment: a reader on another thread sees both or neither
        return cos.index_select(0, positions), sin.index_select(0, positions)


def apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """Rotate ``x[T, heads, head_dim]`` (the rotate-half layout of HF Llama)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]


class LlamaModel(nn.Module):
    inv_freq: Tensor

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        c = config
        q_out = c.num_heads * c.head_dim
        kv_out = c.num_kv_heads * c.head_dim
        self.embed = nn.Parameter(torch.empty(c.vocab_size, c.hidden_size), requires_grad=False)
        self.lm_head = (
            self.embed
            if c.tie_word_embeddings
            else nn.Parameter(torch.empty(c.vocab_size, c.hidden_size), requires_grad=False)
        )
        self.layers = nn.ModuleList(_Layer(c, q_out, kv_out) for _ in range(c.num_layers))
        self.norm = nn.Parameter(torch.ones(c.hidden_size), requires_grad=False)
        self.register_buffer("inv_freq", rope_inv_freq(c), persistent=False)
        self.rope = RopeTable()
        self.packed = False  # dense weights as blocks in AMX tiles (see pack_weights)
        self.tiles = False  # the same: kept as its own name for the layout's readers
        # the weights as blocks, where the loader read them from a GGUF file or quantized them
        self.block_source: Callable[[], Mapping[str, QuantBlocks]] | None = None
        self.head_scale = self.head_offset = torch.empty(0)
        # the dense weights also held as column groups of blocks (pack_groups), beside the
        # float32 ones: what the fused kernels read in steps of few rows, where no tiles are
        self.grouped = False
        self.head_groups = torch.empty(0, dtype=torch.uint8)
        # every layer's weights in decoder_layers' order, listed once (fused_weights): listing
        # them walks 30 modules, about 0.4 ms, too much to repeat every step
        self._fused_weights: list[Tensor] = []
        self._grouped_weights: list[Tensor] = []

    def pack_weights(self, build: KernelBuild | None = None, *, tiles: bool = True) -> bool:
        """Where ``build`` (default: ``kernels.get_build()``) runs the dense layers on AMX
        tiles and the model came from a GGUF file or was quantized on load, so that its
        blocks reproduce its float32 weights exactly, put each dense weight, in place, into
        its blocks in tiles (``quant.pack_tiles``: a fifth of the bytes). No copy is kept:
        afterwards the model serves engines with fused kernels only. Otherwise (or with
        ``tiles=False``) nothing changes: the fused kernels read the float32 weights as the
        torch path does. Idempotent; returns whether the weights are in tiles."""
        if self.packed:
            return True
        if self.grouped:  # the blocks are already beside the float32 weights, which stay
            return False
        from . import kernels

        if not tiles or not (build or kernels.get_build()).tiles_available():
            return False
        blocks = self._exact_blocks()
        if blocks is None:
            return False
        with torch.no_grad():
            for i, layer in enumerate(self._layers()):
                for name, _ in _LINEARS:
                    layer.set_packed(name, *pack_tiles(blocks[f"model.layers.{i}.{name}"]))
            head, self.head_scale, self.head_offset = pack_tiles(blocks["lm_head"])
            if self.config.tie_word_embeddings:
                self.embed = nn.Parameter(head, requires_grad=False)  # rows read from the head
            self.lm_head = nn.Parameter(head, requires_grad=False)
        self.packed = self.tiles = True
        self._fused_weights = []
        return True

    @property
    def has_blocks(self) -> bool:
        """Whether the weights came with their blocks (a GGUF file, or quantized on load):
        what the tiles and the column groups read."""
        return self.block_source is not None

    def pack_groups(self) -> bool:
        """Where the model came from a GGUF file or was quantized on load (its blocks
        reproduce its float32 weights exactly), keep each dense weight and the output head
        also as column groups of blocks (``quant.pack_groups``: a fifth of the float32 bytes
        at 4 bits), beside the float32 weights, so that a fused step can read either: the
        blocks where few rows make the step wait on memory, the float32 weights (the BLAS)
        where many rows make it wait on arithmetic. Idempotent; returns whether the groups
        are there. Not with tiles (``pack_weights``), which replace the float32 weights."""
        if self.grouped:
            return True
        if self.packed:
            return False
        blocks = self._exact_blocks()
        if blocks is None:
            return False
        with torch.no_grad():
            for i, layer in enumerate(self._layers()):
                for name, _ in _LINEARS:
                    layer.groups[name] = pack_groups(blocks[f"model.layers.{i}.{name}"])
            self.head_groups = pack_groups(blocks["lm_head"])
        self.grouped = True
        self._grouped_weights = []
        return True

    def _exact_blocks(self) -> dict[str, QuantBlocks] | None:
        """Each dense layer's blocks, fused as the model fuses them, if every block
        de-quantizes to exactly the weight the model holds."""
        if self.block_source is None:
            return None
        source = self.block_source()
        head = "lm_head.weight" if not self.config.tie_word_embeddings else "model.embed_tokens.weight"
        wanted = {"lm_head": ([head], self.lm_head.t())}
        for i, layer in enumerate(self._layers()):
            for name, parts in _LINEARS:
                names = [f"model.layers.{i}.{p}.weight" for p in parts]
                wanted[f"model.layers.{i}.{name}"] = (names, getattr(layer, name))
        out = {}
        for key, (names, weight) in wanted.items():
            if any(n not in source for n in names):
                log.info("no blocks for %s: float32 weights", names[0])
                return None
            fused = QuantBlocks.cat([source[n] for n in names])
            if not torch.equal(fused.dequantize().t(), weight):
                log.warning("the blocks of %s differ from the loaded weights: float32 weights", names[0])
                return None
            out[key] = fused
        return out

    def require_unpacked(self) -> None:
        """``ValueError`` if ``pack_weights`` ran: the torch path cannot read packed weights."""
        if self.packed:
            raise ValueError(
                "this model's weights are packed for the fused kernels (pack_weights); "
                "load the model again for an engine with kernels='torch'"
            )

    def _embed(self, input_ids: Tensor) -> Tensor:
        if self.packed and self.config.tie_word_embeddings:
            return tile_rows(self.embed, self.head_scale, self.head_offset, input_ids)
        return F.embedding(input_ids, self.embed)

    @torch.inference_mode()
    def forward(self, input_ids: Tensor, batch: AttentionBatch, cache: KVCache, view: BatchView) -> Tensor:
        """Hidden states after the final norm for the rows ``batch.tokens.logit_rows``."""
        self.require_unpacked()
        c = self.config
        x = F.embedding(input_ids, self.embed)
        tokens = batch.tokens
        cos, sin = self.rope(self.inv_freq, tokens.positions)
        sink_rope = self.rope(self.inv_freq, tokens.sink_positions) if tokens.sink_positions is not None else None
        for i, layer in enumerate(self._layers()):
            h = _rms_norm(x, layer.input_norm, c.rms_norm_eps)
            qkv = torch.mm(h, layer.qkv)
            if layer.qkv_bias is not None:
                qkv = qkv + layer.qkv_bias
            q, k, v = torch.split(qkv, [layer.q_out, layer.kv_out, layer.kv_out], dim=-1)
            q = q.view(-1, c.num_heads, c.head_dim)
            k = k.view(-1, c.num_kv_heads, c.head_dim)
            v = v.view(-1, c.num_kv_heads, c.head_dim)
            if layer.q_norm is not None and layer.k_norm is not None:
                q = _rms_norm(q, layer.q_norm, c.rms_norm_eps)
                k = _rms_norm(k, layer.k_norm, c.rms_norm_eps)
                q_stream, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
            else:  # q and k side by side in qkv's rows: one rotation for both (half the small ops)
                qk = apply_rope(
                    qkv[:, : layer.q_out + layer.kv_out].view(-1, c.num_heads + c.num_kv_heads, c.head_dim), cos, sin
                )
                q_stream, k = qk[:, : c.num_heads], qk[:, c.num_heads :]
            q_sink = apply_rope(q, *sink_rope) if sink_rope is not None else None
            # this step's K/V go to the pool (the truth) and to the batch view (what attention
            # reads), before attention, so each token sees itself
            k_t, v_t = k.transpose(0, 1), v.transpose(0, 1)
            cache.k[i].index_copy_(1, tokens.slot_mapping, k_t)
            cache.v[i].index_copy_(1, tokens.slot_mapping, v_t)
            k_view, v_view = view.layer(i)
            k_view.index_copy_(1, batch.view_mapping, k_t)
            v_view.index_copy_(1, batch.view_mapping, v_t)
            attn = batch.attend(q_stream, q_sink, k_view, v_view)
            x = x + torch.mm(attn, layer.o_proj)
            if layer.o_bias is not None:
                x = x + layer.o_bias
            h = _rms_norm(x, layer.post_norm, c.rms_norm_eps)
            gate, up = torch.mm(h, layer.gate_up).chunk(2, dim=-1)
            x = x + torch.mm(F.silu(gate).mul_(up), layer.down_proj)
        x = x[tokens.logit_rows] if tokens.logit_rows is not None else x
        return _rms_norm(x, self.norm, c.rms_norm_eps)

    @torch.inference_mode()
    def forward_fused(
        self, input_ids: Tensor, batch: PagedBatch, cache: KVCache, ops: Any, *, groups: bool = False
    ) -> Tensor:
        """``forward`` on the fused kernels of one build (``ops``: ``KernelBuild.ops``,
        ``kernels/ops.cpp``): all layers in one call, nine kernels a layer, and attention
        reads each session's blocks in place in the pool. ``groups``: the dense layers read
        the blocks (``pack_groups``), not the float32 weights."""
        c = self.config
        tokens = batch.tokens
        cos, sin = self.rope(self.inv_freq, tokens.positions)
        sink_cos = sink_sin = None
        if tokens.sink_positions is not None:
            sink_cos, sink_sin = self.rope(self.inv_freq, tokens.sink_positions)
        if not c.plain_layers:
            rope = (cos, sin, sink_cos, sink_sin)
            x = self._layers_one_by_one(self._embed(input_ids), batch, cache, rope, ops, groups=groups)
            x = x[tokens.logit_rows] if tokens.logit_rows is not None else x
            return cast(Tensor, ops.rms_norm(x.contiguous(), self.norm, c.rms_norm_eps))
        x = ops.decoder_layers(
            self._embed(input_ids),
            self.fused_weights(groups=groups),
            cache.k,
            cache.v,
            cos,
            sin,
            sink_cos,
            sink_sin,
            tokens.slot_mapping,
            batch.query_start,
            tokens.positions,
            batch.block_logical,
            batch.block_physical,
            batch.block_count,
            batch.block_size,
            batch.window,
            batch.sinks,
            c.num_heads,
            c.intermediate_size,
            c.rms_norm_eps,
            batch.pinned,
        )
        x = x[tokens.logit_rows] if tokens.logit_rows is not None else x
        return cast(Tensor, ops.rms_norm(x.contiguous(), self.norm, c.rms_norm_eps))

    def fused_weights(self, *, groups: bool = False) -> list[Tensor]:
        """Per layer, as kernels/ops.cpp's decoder_layers reads them: a norm, two dense
        layers, a norm, two dense layers, each dense layer as (weight, scale, offset);
        with ``groups``, each dense layer's column groups (``pack_groups``) as its weight."""
        if groups:
            if not self.grouped:
                raise ValueError("this model holds no column groups of blocks: call pack_groups() first")
            if not self._grouped_weights:
                self._grouped_weights = self._list_fused_weights(groups=True)
            return self._grouped_weights
        if not self._fused_weights:
            self._fused_weights = self._list_fused_weights()
        return self._fused_weights

    def _layers_one_by_one(
        self,
        x: Tensor,
        batch: PagedBatch,
        cache: KVCache,
        rope: tuple[Tensor, Tensor, Tensor | None, Tensor | None],
        ops: Any,
        *,
        groups: bool = False,
    ) -> Tensor:
        """``decoder_layers``' kernels called per layer from Python, with the families' extra
        steps between them (q/k/v and o biases, q/k norms). About ten calls a layer: for a
        24-layer model a millisecond or two a step, against tens of milliseconds of weights."""
        c = self.config
        tokens = batch.tokens
        cos, sin, sink_cos, sink_sin = rope
        width = (c.num_heads + 2 * c.num_kv_heads) * c.head_dim
        q_out, kv_out = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
        scale = 1.0 / math.sqrt(c.head_dim)
        for i, layer in enumerate(self._layers()):
            kc, vc = cache.k[i], cache.v[i]
            h = ops.rms_norm(x, layer.input_norm, c.rms_norm_eps)
            qkv = ops.linear(h, *layer.packed("qkv", groups), width, None)
            if layer.qkv_bias is not None:
                qkv += layer.qkv_bias
            if layer.q_norm is not None and layer.k_norm is not None:
                for start, size, weight in ((0, q_out, layer.q_norm), (q_out, kv_out, layer.k_norm)):
                    heads = qkv[:, start : start + size].reshape(-1, c.head_dim)
                    normed = ops.rms_norm(heads, weight, c.rms_norm_eps)
                    qkv[:, start : start + size] = normed.view(-1, size)
            q, q_sink = ops.rope_store(qkv, cos, sin, sink_cos, sink_sin, tokens.slot_mapping, kc, vc, c.num_heads)
            attn = ops.paged_attention(
                q,
                q_sink if sink_cos is not None else None,
                kc,
                vc,
                batch.query_start,
                tokens.positions,
                batch.block_logical,
                batch.block_physical,
                batch.block_count,
                batch.block_size,
                batch.window,
                batch.sinks,
                scale,
                batch.pinned,
            )
            x = ops.linear(attn, *layer.packed("o_proj", groups), c.hidden_size, x)
            if layer.o_bias is not None:
                x += layer.o_bias
            h = ops.rms_norm(x, layer.post_norm, c.rms_norm_eps)
            act = ops.silu_mul(ops.linear(h, *layer.packed("gate_up", groups), 2 * c.intermediate_size, None))
            x = ops.linear(act, *layer.packed("down_proj", groups), c.hidden_size, x)
        return x

    def _list_fused_weights(self, *, groups: bool = False) -> list[Tensor]:
        out: list[Tensor] = []
        for layer in self._layers():
            for norm, linears in ((layer.input_norm, ("qkv", "o_proj")), (layer.post_norm, ("gate_up", "down_proj"))):
                out.append(norm)
                for name in linears:
                    out.extend(layer.packed(name, groups))
        return out

    def _layers(self) -> list[_Layer]:
        return [cast(_Layer, layer) for layer in self.layers]

    @torch.inference_mode()
    def logits(self, hidden: Tensor, ops: Any = None) -> Tensor:
        """The output head; with ``ops`` (a fused build's), read from its column groups of
        blocks (``pack_groups``)."""
        if ops is not None:
            if not self.grouped:
                raise ValueError("this model holds no column groups of blocks: call pack_groups() first")
            return cast(Tensor, ops.linear(hidden, self.head_groups, _EMPTY, _EMPTY, self.config.vocab_size, None))
        if self.packed:
            from . import kernels

            # tiles are in the native build only
            return cast(
                Tensor,
                kernels.get_build("native").ops.linear(
                    hidden, self.lm_head, self.head_scale, self.head_offset, self.config.vocab_size, None
                ),
            )
        return F.linear(hidden, self.lm_head)

    def load_hf_state_dict(self, state: dict[str, Tensor]) -> None:
        """Copy weights named as in HF ``LlamaForCausalLM``; fuses q/k/v and gate/up."""
        self.require_unpacked()
        c = self.config
        missing: list[str] = []

        def take(name: str) -> Tensor:
            t = state.get(name)
            if t is None:
                missing.append(name)
                return torch.empty(0)
            return t.to(torch.float32)

        with torch.no_grad():
            self.embed.copy_(take("model.embed_tokens.weight"))
            if not c.tie_word_embeddings:
                self.lm_head.copy_(take("lm_head.weight"))
            self.norm.copy_(take("model.norm.weight"))
            for i, layer in enumerate(self._layers()):
                p = f"model.layers.{i}."
                parts = [take(p + f"self_attn.{n}_proj.weight") for n in ("q", "k", "v")]
                gu = [take(p + f"mlp.{n}_proj.weight") for n in ("gate", "up")]
                if missing:
                    break
                layer.qkv.copy_(torch.cat(parts, dim=0).t())
                layer.o_proj.copy_(take(p + "self_attn.o_proj.weight").t())
                layer.gate_up.copy_(torch.cat(gu, dim=0).t())
                layer.down_proj.copy_(take(p + "mlp.down_proj.weight").t())
                layer.input_norm.copy_(take(p + "input_layernorm.weight"))
                layer.post_norm.copy_(take(p + "post_attention_layernorm.weight"))
                if layer.qkv_bias is not None:
                    layer.qkv_bias.copy_(torch.cat([take(p + f"self_attn.{n}_proj.bias") for n in ("q", "k", "v")]))
                if layer.o_bias is not None:
                    layer.o_bias.copy_(take(p + "self_attn.o_proj.bias"))
                if layer.q_norm is not None and layer.k_norm is not None:
                    layer.q_norm.copy_(take(p + "self_attn.q_norm.weight"))
                    layer.k_norm.copy_(take(p + "self_attn.k_norm.weight"))
        if missing:
            raise ValueError(
                f"weights are missing tensors {missing[:3]}...; is this a {c.model_type} checkpoint of this config?"
            )


class _Layer(nn.Module):
    qkv: nn.Parameter
    o_proj: nn.Parameter
    gate_up: nn.Parameter
    down_proj: nn.Parameter
    input_norm: nn.Parameter
    post_norm: nn.Parameter
    qkv_bias: nn.Parameter | None
    o_bias: nn.Parameter | None
    q_norm: nn.Parameter | None
    k_norm: nn.Parameter | None

    def __init__(self, c: ModelConfig, q_out: int, kv_out: int) -> None:
        super().__init__()
        self.q_out, self.kv_out = q_out, kv_out
        h, f = c.hidden_size, c.intermediate_size
        # stored [in, out]: x @ W with small batches runs faster here than F.linear's x @ W.T
        self.qkv = nn.Parameter(torch.empty(h, q_out + 2 * kv_out), requires_grad=False)
        self.o_proj = nn.Parameter(torch.empty(q_out, h), requires_grad=False)
        self.gate_up = nn.Parameter(torch.empty(h, 2 * f), requires_grad=False)
        self.down_proj = nn.Parameter(torch.empty(f, h), requires_grad=False)
        self.input_norm = nn.Parameter(torch.ones(h), requires_grad=False)
        self.post_norm = nn.Parameter(torch.ones(h), requires_grad=False)

        def optional(on: bool, size: int, fill: float) -> nn.Parameter | None:
            return nn.Parameter(torch.full((size,), fill), requires_grad=False) if on else None

        self.qkv_bias = optional(c.qkv_bias, q_out + 2 * kv_out, 0.0)
        self.o_bias = optional(c.o_bias, h, 0.0)
        self.q_norm = optional(c.qk_norm, c.head_dim, 1.0)
        self.k_norm = optional(c.qk_norm, c.head_dim, 1.0)
        # per dense layer, once packed: the tiles' scale and offset (none for float32)
        self.scales: dict[str, tuple[Tensor, Tensor]] = {}
        # per dense layer, with pack_groups: its blocks in column groups (quant.pack_groups)
        self.groups: dict[str, Tensor] = {}

    def set_packed(self, name: str, weight: Tensor, scale: Tensor, offset: Tensor) -> None:
        setattr(self, name, nn.Parameter(weight, requires_grad=False))
        self.scales[name] = (scale, offset)

    def packed(self, name: str, groups: bool = False) -> tuple[Tensor, Tensor, Tensor]:
        """(weight, scale, offset) of a dense layer, as the ``linear`` kernel takes them,
        whichever layout it holds (float32 ``[K, N]``: scale and offset empty); with
        ``groups``, its column groups of blocks (scale and offset empty too)."""
        if groups:
            return self.groups[name], _EMPTY, _EMPTY
        scale, offset = self.scales.get(name, (_EMPTY, _EMPTY))
        return getattr(self, name), scale, offset


_EMPTY = torch.empty(0)


def _rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    # torch's own kernel: HF's formula (x * rsqrt(mean(x^2) + eps) * weight) in one pass, not five
    return F.rms_norm(x, (x.shape[-1],), weight, eps)
