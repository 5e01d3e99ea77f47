"""Low-bit weight blocks (GGUF Q4_1 and Q8_0) and the tile layout the AMX kernels read.

Blocks come from a GGUF file (``read_gguf_blocks``) or from quantizing float weights on
load (``quantize_weight``: the same two formats, computed as llama.cpp's reference
quantizer computes them, so a safetensors folder quantized here feeds the same kernels).

GGUF stores a weight ``[N, K]`` in blocks of 32 along K:
``W[n, k] = scale[n, k // 32] * q[n, k] + offset[n, k // 32]``, with ``q`` a 4-bit
(Q4_1) or 8-bit (Q8_0, no offset) integer and the scale and offset float16. In float32
``scale * q`` is exact (11 + 8 significant bits), so the one rounding of the add makes
``dequantize`` equal, bit for bit, to the float32 weights the loader wrote; ``pack_weights``
checks that before it trusts the blocks. The tile kernels (``kernels/tiles.cpp``) widen
``q`` to bfloat16, where such small integers are exact too.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np
import torch
from torch import Tensor

from .config import ModelConfig

__all__ = [
    "BLOCK",
    "GROUP_COLS",
    "QUANT_KINDS",
    "TILE_COLS",
    "QuantBlocks",
    "Quantize",
    "gguf_tensor_names",
    "pack_groups",
    "pack_tiles",
    "quantize_weight",
    "read_gguf_blocks",
    "tile_rows",
]

BLOCK = 32  # k per block (GGUF's QK4_1 and QK8_0)
TILE_COLS = 16  # output columns per tile (kCols in kernels/tiles.cpp)

# weight-only quantization on load: 8-bit blocks (Q8_0: int8, one scale per 32) or 4-bit
# blocks (Q4_1: 0..15, a scale and an offset per 32)
Quantize = Literal["q8_0", "q4_1"]
QUANT_KINDS: tuple[Quantize, ...] = ("q8_0", "q4_1")


@dataclass(frozen=True, slots=True)
class QuantBlocks:
    """One weight ``[N, K]`` as blocks: ``scale * q + offset`` per 32 k of a row."""

    q: Tensor  # integers [N, K] (int8 as read from GGUF)
    scale: Tensor  # float32 [N, K // 32]
    offset: Tensor | None  # float32 [N, K // 32]; None for Q8_0

    def dequantize(self) -> Tensor:
        """The float32 weight ``[N, K]``, rounded as GGUF's own de-quantizer rounds it."""
        n, k = self.q.shape
        w = self.q.to(torch.float32).view(n, k // BLOCK, BLOCK) * self.scale[..., None]
        if self.offset is not None:
            w = w + self.offset[..., None]
        return w.view(n, k)

    @staticmethod
    def cat(parts: Sequence[QuantBlocks]) -> QuantBlocks:
        """Weights stacked along N, as the model fuses q/k/v and gate/up."""
        offsets = [p.offset if p.offset is not None else torch.zeros_like(p.scale) for p in parts]
        return QuantBlocks(
            torch.cat([p.q for p in parts]),
            torch.cat([p.scale for p in parts]),
            torch.cat(offsets) if any(p.offset is not None for p in parts) else None,
        )


def quantize_weight(weight: Tensor, kind: Quantize) -> QuantBlocks:
    """A float weight ``[N, K]`` (K a multiple of 32) as blocks of 32 along K, with the scale
    and offset rounded to float16 as GGUF stores them and ``q`` chosen against the rounded
    values. ``q4_1``: offset = the block's minimum, scale = range / 15, q in 0..15.
    ``q8_0``: scale = the block's largest magnitude / 127, q in -127..127, no offset."""
    if kind not in QUANT_KINDS:
        raise ValueError(f"quantize must be one of {list(QUANT_KINDS)} or None, got {kind!r}")
    if weight.dim() != 2 or weight.shape[1] % BLOCK:
        raise ValueError(f"a weight to quantize must be [N, K] with K a multiple of {BLOCK}, got {tuple(weight.shape)}")
    n, k = weight.shape
    w = weight.to(torch.float32).view(n, k // BLOCK, BLOCK)
    if kind == "q8_0":
        scale = (w.abs().amax(-1) / 127).half().float()
        inv = torch.where(scale > 0, 1.0 / scale, torch.zeros_like(scale))
        q = (w * inv[..., None]).round().clamp(-127, 127).to(torch.int8)
        return QuantBlocks(q.view(n, k), scale, None)
    low = w.amin(-1).half().float()
    scale = ((w.amax(-1) - low) / 15).half().float()
    inv = torch.where(scale > 0, 1.0 / scale, torch.zeros_like(scale))
    q = ((w - low[..., None]) * inv[..., None]).round().clamp(0, 15).to(torch.int8)
    return QuantBlocks(q.view(n, k), scale, low)


def pack_tiles(blocks: QuantBlocks) -> tuple[Tensor, Tensor, Tensor]:
    """``(q, scale, offset)`` in the tile kernels' layout (``kernels/tiles.h``).

    Tile ``[p, b]`` covers columns ``16 p .. 16 p + 15`` and ``k = 32 b .. 32 b + 31``; its
    row ``i`` holds lanes ``t = 2 j + e`` for column ``16 p + j`` and ``k = 32 b + 2 i + e``
    (the pairs a tile product takes). With an offset (Q4_1) a row is 16 bytes, lane ``t`` in
    the low nibble of byte ``t % 16`` for ``t < 16``, else the high one: ``q`` is uint8
    ``[P, K / 32, 16, 16]``. Without one (Q8_0) a row is the 32 lanes, int8. ``scale`` and
    ``offset`` are ``[P, K / 32, 16]``; ``offset`` is empty without one. Columns past N are
    zero."""
    n, k = blocks.q.shape
    if k % BLOCK:
        raise ValueError(f"a block weight needs K divisible by {BLOCK}, got K={k}")
    q4 = blocks.offset is not None
    if q4 and (blocks.q.min() < 0 or blocks.q.max() > 15):
        raise ValueError("4-bit blocks (with an offset) need q in 0..15")
    nb, panels = k // BLOCK, -(-n // TILE_COLS)
    pad = panels * TILE_COLS - n

    def rows(t: Tensor) -> Tensor:
        return torch.cat([t, t.new_zeros(pad, t.shape[1])]) if pad else t

    lanes = rows(blocks.q.to(torch.int16)).view(panels, TILE_COLS, nb, 16, 2).permute(0, 2, 3, 1, 4)
    lanes = lanes.reshape(panels, nb, 16, 2 * TILE_COLS)
    if q4:
        q = (lanes[..., :16] | (lanes[..., 16:] << 4)).to(torch.uint8).contiguous()
    else:
        q = lanes.to(torch.int8).contiguous()

    def per_tile(t: Tensor) -> Tensor:
        return rows(t).view(panels, TILE_COLS, nb).permute(0, 2, 1).contiguous()

    offset = per_tile(blocks.offset) if blocks.offset is not None else torch.empty(0)
    return q, per_tile(blocks.scale), offset


GROUP_COLS = 4  # output columns per record (kGroup in kernels/groups.cpp)


def pack_groups(blocks: QuantBlocks) -> Tensor:
    """The blocks in the vector kernels' layout (``kernels/groups.h``): uint8
    ``[ceil(N / 4), K / 32, bytes]``, one record per 4 columns and 32 k, so that a pass
    over a few columns reads one stream. Q4_1 (with an offset): per column 16 bytes,
    element ``j`` in the low nibble of byte ``j`` and ``j + 16`` in the high one, then the
    4 scales and the 4 offsets as float16 (80 bytes). Q8_0: per column 32 int8, then the
    4 scales as float16 (136 bytes). Columns past N are zero. ``ValueError`` if a scale or
    offset is not a float16 value (GGUF's and ``quantize_weight``'s always are)."""
    n, k = blocks.q.shape
    if k % BLOCK:
        raise ValueError(f"a block weight needs K divisible by {BLOCK}, got K={k}")
    offset = blocks.offset
    if offset is not None and (blocks.q.min() < 0 or blocks.q.max() > 15):
        raise ValueError("4-bit blocks (with an offset) need q in 0..15")
    nb, groups = k // BLOCK, -(-n // GROUP_COLS)
    pad = groups * GROUP_COLS - n

    def rows(t: Tensor) -> Tensor:
        return torch.cat([t, t.new_zeros(pad, *t.shape[1:])]) if pad else t

    def halves(t: Tensor) -> Tensor:  # [N, nb] float32 -> [G, nb, 4 * 2] bytes
        h = t.half()
        if not torch.equal(h.float(), t):
            raise ValueError("block scales and offsets must be float16 values")
        return rows(h).view(groups, GROUP_COLS, nb).permute(0, 2, 1).contiguous().view(torch.uint8)

    q = rows(blocks.q).view(groups, GROUP_COLS, nb, BLOCK).permute(0, 2, 1, 3)  # [G, nb, 4, 32]
    if offset is not None:
        q = q.to(torch.uint8)
        parts = [(q[..., :16] | (q[..., 16:] << 4)).reshape(groups, nb, -1), halves(blocks.scale), halves(offset)]
    else:
        parts = [q.to(torch.int8).contiguous().view(torch.uint8).reshape(groups, nb, -1), halves(blocks.scale)]
    return torch.cat(parts, dim=-1).contiguous()


def tile_rows(q: Tensor, scale: Tensor, offset: Tensor, ids: Tensor) -> Tensor:
    """Rows ``ids`` of the weight ``[N, K]`` held in tiles (``pack_tiles``), as float32:
    a tied model's embedding lookup."""
    nb = q.shape[1]
    p, j = ids // TILE_COLS, ids % TILE_COLS
    blocks = torch.arange(nb)[None, :, None, None]
    pairs = torch.arange(16)[None, None, :, None]
    lanes = (2 * j)[:, None, None, None] + torch.arange(2)  # [T, 1, 1, 2]
    if q.dtype == torch.uint8:  # 4-bit: lane t in byte t % 16, high nibble from t = 16
        values = (q[p[:, None, None, None], blocks, pairs, lanes % 16] >> (4 * (lanes // 16))) & 0x0F
    else:
        values = q[p[:, None, None, None], blocks, pairs, lanes]
    w = values.to(torch.float32).reshape(len(ids), nb, BLOCK) * scale[p, :, j][..., None]
    if offset.numel():
        w = w + offset[p, :, j][..., None]
    return w.view(len(ids), nb * BLOCK)


# GGUF tensor names of a Llama model, and the HF names the loader gives them
_LAYER_NAMES = {
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def gguf_tensor_names(path: Path) -> set[str]:
    """The names of the tensors a GGUF file holds (its header only is read)."""
    with open(path, "rb") as f:
        data = np.frombuffer(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ), dtype=np.uint8)
    return {name for name, *_ in _gguf_tensors(data)[1]}


def read_gguf_blocks(path: Path, config: ModelConfig) -> dict[str, QuantBlocks]:
    """The Q4_1 and Q8_0 weights of a GGUF file (Llama, Mistral, Qwen2, Qwen3), by HF name.
    Other tensor types are left out (their weights load as float32). In a file of the
    ``llama`` architecture the rows of q and k are put back in HF's order (llama.cpp's
    converter interleaves each head's rotary halves there, and only there), as the loader does."""
    out: dict[str, QuantBlocks] = {}
    with open(path, "rb") as f:
        data = np.frombuffer(mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ), dtype=np.uint8)
    arch, tensors = _gguf_tensors(data)
    for gguf_name, kind, rows, row_bytes, offset in tensors:
        name = _hf_name(gguf_name)
        if name is None or kind not in _KINDS:
            continue
        blocks = _decode(data[offset : offset + rows * row_bytes].reshape(rows, row_bytes), _KINDS[kind])
        if arch == "llama" and name.endswith("q_proj.weight"):
            blocks = _unpermute(blocks, config.num_heads)
        elif arch == "llama" and name.endswith("k_proj.weight"):
            blocks = _unpermute(blocks, config.num_kv_heads)
        out[name] = blocks
    return out


_KINDS = {3: "Q4_1", 8: "Q8_0"}  # GGML type ids
_BLOCK_BYTES = {"Q4_1": 20, "Q8_0": 34}
# GGUF metadata value types with a fixed size: u8 i8 u16 i16 u32 i32 f32 bool u64 i64 f64
_SCALAR_BYTES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def _gguf_tensors(data: np.ndarray) -> tuple[str, list[tuple[str, int, int, int, int]]]:
    """The file's ``general.architecture``, and (name, type id, rows, bytes a row, data
    offset) of each tensor in a GGUF v2/v3 file.

    A reader of its own: ``gguf.GGUFReader`` also decodes every metadata field (the
    tokenizer's 100,000 strings), which takes seconds."""
    buf = data.data
    if bytes(buf[:4]) != b"GGUF":
        raise ValueError("not a GGUF file")
    _, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
    pos, alignment, arch = 24, 32, ""

    def string(at: int) -> tuple[str, int]:
        (length,) = struct.unpack_from("<Q", buf, at)
        return bytes(buf[at + 8 : at + 8 + length]).decode(), at + 8 + length

    def skip(kind: int, at: int) -> int:
        if kind in _SCALAR_BYTES:
            return at + _SCALAR_BYTES[kind]
        if kind == 8:  # string
            (length,) = struct.unpack_from("<Q", buf, at)
            return int(at + 8 + length)
        if kind == 9:  # array: element type, count, elements
            inner, count = struct.unpack_from("<IQ", buf, at)
            at += 12
            if inner in _SCALAR_BYTES:
                return int(at + count * _SCALAR_BYTES[inner])
            for _ in range(count):
                at = skip(inner, at)
            return at
        raise ValueError(f"unknown GGUF metadata type {kind}")

    for _ in range(n_kv):
        key, pos = string(pos)
        (kind,) = struct.unpack_from("<I", buf, pos)
        if key == "general.alignment":
            (alignment,) = struct.unpack_from("<I", buf, pos + 4)
        elif key == "general.architecture" and kind == 8:
            arch, _ = string(pos + 4)
        pos = skip(kind, pos + 4)
    infos = []
    for _ in range(n_tensors):
        name, pos = string(pos)
        (n_dims,) = struct.unpack_from("<I", buf, pos)
        dims = struct.unpack_from(f"<{n_dims}Q", buf, pos + 4)
        kind, offset = struct.unpack_from("<IQ", buf, pos + 4 + 8 * n_dims)
        pos += 4 + 8 * n_dims + 12
        infos.append((name, kind, dims, offset))
    start = -(-pos // alignment) * alignment
    out = []
    for name, kind, dims, offset in infos:
        rows = int(np.prod(dims[1:])) if len(dims) > 1 else 1
        row_bytes = dims[0] // BLOCK * _BLOCK_BYTES[_KINDS[kind]] if kind in _KINDS else 0
        out.append((name, kind, rows, row_bytes, start + offset))
    return arch, out


def _hf_name(gguf_name: str) -> str | None:
    if gguf_name == "token_embd.weight":
        return "model.embed_tokens.weight"
    if gguf_name == "output.weight":
        return "lm_head.weight"
    parts = gguf_name.split(".")
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in _LAYER_NAMES and parts[3] == "weight":
        return f"model.layers.{parts[1]}.{_LAYER_NAMES[parts[2]]}.weight"
    return None


def _decode(raw: np.ndarray, kind: str) -> QuantBlocks:
    """Rows of GGUF blocks (``uint8 [N, bytes]``) into q, scale and offset."""
    n = raw.shape[0]
    if kind == "Q4_1":  # per block: f16 d, f16 m, 16 bytes: element j low nibble, j + 16 high
        blocks = raw.reshape(n, -1, 20)
        d = blocks[..., 0:2].copy().view(np.float16)[..., 0]
        m = blocks[..., 2:4].copy().view(np.float16)[..., 0]
        qs = blocks[..., 4:]
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=-1).astype(np.int8)
        offset: Tensor | None = torch.from_numpy(m.astype(np.float32))
    else:  # Q8_0 per block: f16 d, 32 int8
        blocks = raw.reshape(n, -1, 34)
        d = blocks[..., 0:2].copy().view(np.float16)[..., 0]
        q = blocks[..., 2:].copy().view(np.int8)
        offset = None
    return QuantBlocks(torch.from_numpy(q.reshape(n, -1)), torch.from_numpy(d.astype(np.float32)), offset)


def _unpermute(blocks: QuantBlocks, heads: int) -> QuantBlocks:
    n = blocks.q.shape[0]
    order = torch.arange(n).view(heads, n // heads // 2, 2).transpose(1, 2).reshape(n)
    offset = blocks.offset[order] if blocks.offset is not None else None
    return QuantBlocks(blocks.q[order], blocks.scale[order], offset)
