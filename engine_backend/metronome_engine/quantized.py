"""Weight-only quantization on load, cached on disk.

A safetensors folder asked for ``quantize="q8_0"`` or ``"q4_1"`` has its dense weights (the
seven of each layer, the embedding and the output head) quantized once into blocks of 32
(``quant.quantize_weight``) and written under ``$METRONOME_CACHE/quantized/``; later loads
read that file. Under ``q4_1`` the embedding and the output head take 8 bits (``q8_0``), as
in llama.cpp's own 4-bit files: with its head at 4 bits too, SmolLM2's perplexity rose 6%
(10.61 -> 11.24 over 2,048 tokens). The key covers the folder's path and its weight files' sizes and times,
so an edited folder is quantized again. Norms and biases stay float32, as in GGUF files.

On disk a block weight is three tensors: ``q`` (int8 ``[N, K]``, or for 4 bits uint8
``[N, K / 2]`` holding element ``2 j`` in the low nibble and ``2 j + 1`` in the high one),
``scale`` and ``offset`` (float16 ``[N, K / 32]``, as GGUF stores them): a 4-bit weight
takes 5 bits, an 8-bit one 8.5.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterable
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from torch import Tensor

from .config import ModelConfig
from .quant import QUANT_KINDS, QuantBlocks, Quantize, quantize_weight

__all__ = ["FORMAT_VERSION", "block_weight_names", "cached_blocks_path", "quantize_folder", "read_blocks"]

FORMAT_VERSION = 2  # bump when the file's layout or the quantizer changes: old files are then not read

_LAYER_WEIGHTS = (
    "self_attn.q_proj",
    "self_attn.k_proj",
    "self_attn.v_proj",
    "self_attn.o_proj",
    "mlp.gate_proj",
    "mlp.up_proj",
    "mlp.down_proj",
)


def block_weight_names(config: ModelConfig) -> list[str]:
    """The HF names of the weights held as blocks: every dense layer, the embedding, and
    the output head where it is not the embedding."""
    names = ["model.embed_tokens.weight"]
    if not config.tie_word_embeddings:
        names.append("lm_head.weight")
    for i in range(config.num_layers):
        names += [f"model.layers.{i}.{w}.weight" for w in _LAYER_WEIGHTS]
    return names


def cached_blocks_path(cache: Path, model_dir: Path, files: Iterable[Path], kind: Quantize) -> Path:
    """Where ``model_dir``'s weights quantized to ``kind`` live in ``cache``."""
    key = hashlib.sha256(f"v{FORMAT_VERSION} {kind} {model_dir.resolve()}".encode())
    for f in sorted(files):
        st = f.stat()
        key.update(f"{f.name} {st.st_size} {st.st_mtime_ns}".encode())
    return cache / "quantized" / f"{model_dir.name}-{kind}-{key.hexdigest()[:16]}.safetensors"


def quantize_folder(state: dict[str, Tensor], config: ModelConfig, kind: Quantize, target: Path) -> None:
    """Quantize the block weights of ``state`` (a model's HF state dict) into ``target``."""
    if kind not in QUANT_KINDS:
        raise ValueError(f"quantize must be one of {list(QUANT_KINDS)} or None, got {kind!r}")
    tensors: dict[str, Tensor] = {}
    for name in block_weight_names(config):
        if name not in state:
            raise ValueError(f"the weights hold no {name}; is this a {config.model_type} checkpoint of this config?")
        try:
            blocks = quantize_weight(state[name], _kind_of(name, kind))
        except ValueError as exc:
            raise ValueError(f"{name} cannot be quantized to {kind}: {exc}") from exc
        q = blocks.q
        if blocks.offset is not None:  # 4 bits: two to a byte
            q = (q[:, 0::2] | (q[:, 1::2] << 4)).to(torch.uint8)
            tensors[f"{name}.offset"] = blocks.offset.half()
        tensors[f"{name}.q"] = q.contiguous()
        tensors[f"{name}.scale"] = blocks.scale.half()
    target.parent.mkdir(parents=True, exist_ok=True)
    # write beside the target and rename: a crash or a racing process never leaves half a file
    fd, tmp = tempfile.mkstemp(prefix=".quantize-", suffix=".safetensors", dir=target.parent)
    os.close(fd)
    try:
        save_file(tensors, tmp, metadata={"kind": kind, "format": json.dumps(FORMAT_VERSION)})
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _kind_of(name: str, kind: Quantize) -> Quantize:
    return "q8_0" if name in ("model.embed_tokens.weight", "lm_head.weight") else kind


def read_blocks(path: Path) -> dict[str, QuantBlocks]:
    """The blocks ``quantize_folder`` wrote, by HF weight name."""
    out: dict[str, QuantBlocks] = {}
    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
        if meta.get("format") != json.dumps(FORMAT_VERSION) or meta.get("kind") not in QUANT_KINDS:
            raise ValueError(f"{path} is not a quantized-weights file of format {FORMAT_VERSION}; delete it")
        keys = set(f.keys())
        for key in sorted(keys):
            if not key.endswith(".q"):
                continue
            name = key[: -len(".q")]
            q = f.get_tensor(key)
            offset = f.get_tensor(f"{name}.offset").float() if f"{name}.offset" in keys else None
            if offset is not None:  # unpack the nibbles
                q = torch.stack([q & 0x0F, q >> 4], dim=-1).view(q.shape[0], -1).to(torch.int8)
            out[name] = QuantBlocks(q, f.get_tensor(f"{name}.scale").float(), offset)
    return out
