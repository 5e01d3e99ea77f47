"""Model architecture: the hyper-parameters of the decoder families this runner serves.

One decoder covers them all (RMSNorm, RoPE, GQA, SwiGLU); the families differ in a few
options, each a field here: Llama 3's scaled RoPE (``rope_scaling``), Qwen2's q/k/v bias
(``qkv_bias``), Qwen3's per-head q/k RMSNorm (``qk_norm``), Mistral's sliding window
(``sliding_window``), tied or untied embeddings. An option outside these is refused by name
when the config is read, never ignored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["FAMILIES", "ModelConfig", "RopeScaling"]

# HF model_type values this runner serves
FAMILIES = ("llama", "mistral", "qwen2", "qwen3")


@dataclass(frozen=True, slots=True, kw_only=True)
class RopeScaling:
    """A RoPE frequency scaling that is a fixed function of the frequencies (so keys rotated
    once stay valid): ``linear`` divides every frequency by ``factor``; ``llama3`` (Llama
    3.1/3.2) divides the low ones by ``factor``, keeps the high ones, and blends between."""

    kind: str  # "linear" or "llama3"
    factor: float
    low_freq_factor: float = 1.0
    high_freq_factor: float = 4.0
    original_max_position_embeddings: int = 8192

    def __post_init__(self) -> None:
        if self.kind not in ("linear", "llama3"):
            raise ValueError(f"rope scaling kind {self.kind!r} is not supported; 'linear' and 'llama3' are")
        if not self.factor > 0:
            raise ValueError(f"rope scaling factor must be > 0, got {self.factor!r}")
        if self.kind == "llama3" and not self.high_freq_factor > self.low_freq_factor > 0:
            raise ValueError(
                f"llama3 rope scaling needs high_freq_factor > low_freq_factor > 0, got "
                f"{self.high_freq_factor!r} and {self.low_freq_factor!r}"
            )


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float = 10000.0
    rms_norm_eps: float = 1e-5
    max_position_embeddings: int = 2048
    tie_word_embeddings: bool = True
    rope_scaling: RopeScaling | None = None
    qkv_bias: bool = False  # Qwen2; Llama and Qwen3 with attention_bias
    o_bias: bool = False  # Llama and Qwen3 with attention_bias
    qk_norm: bool = False  # Qwen3: RMSNorm over each head of q and k, before RoPE
    # Mistral v0.1: each token attends to its last `sliding_window` tokens only
    sliding_window: int | None = None
    model_type: str = "llama"

    def __post_init__(self) -> None:
        for name in (
            "vocab_size",
            "hidden_size",
            "intermediate_size",
            "num_layers",
            "num_heads",
            "num_kv_heads",
            "head_dim",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive int, got {value!r}")
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_heads ({self.num_heads}) must be a multiple of num_kv_heads ({self.num_kv_heads})")
        if self.head_dim % 2:
            raise ValueError(f"head_dim must be even for RoPE, got {self.head_dim}")
        if self.sliding_window is not None and self.sliding_window < 1:
            raise ValueError(f"sliding_window must be a positive int or None, got {self.sliding_window!r}")

    @property
    def group_size(self) -> int:
        return self.num_heads // self.num_kv_heads

    @property
    def plain_layers(self) -> bool:
        """No bias and no q/k norm: every layer is the Llama layer the fused
        ``decoder_layers`` kernel runs in one call."""
        return not (self.qkv_bias or self.o_bias or self.qk_norm)

    def check_kv_window(self, window: int | None) -> None:
        """``ValueError`` where the engine would attend further back than the model does: a
        model with a ``sliding_window`` needs a KV window no longer than it (``None`` is
        the full policy)."""
        if self.sliding_window is not None and (window is None or window > self.sliding_window):
            kept = "every token (the full policy)" if window is None else f"a window of {window} tokens"
            raise ValueError(
                f"this {self.model_type} model attends to its last {self.sliding_window} tokens only "
                f"(sliding_window), the KV policy to {kept}; use KVPolicy.windowed(W) with W <= {self.sliding_window}"
            )

    def kv_bytes_per_token(self, dtype_bytes: int = 4) -> int:
        """Bytes of K and V one token occupies across all layers."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * dtype_bytes

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> ModelConfig:
        """From a Hugging Face ``config.json`` of a Llama, Mistral, Qwen2/2.5 or Qwen3 model
        (the ``rope_scaling`` of older files and the ``rope_parameters`` of transformers 5)."""
        arch = hf.get("model_type", "llama")
        if arch not in FAMILIES:
            raise ValueError(f"model_type {arch!r} is not a family this runner serves; it serves {list(FAMILIES)}")
        act = hf.get("hidden_act", "silu")
        if act != "silu":
            raise ValueError(f"hidden_act {act!r} is not supported; the runner's MLP is SwiGLU (silu)")
        if hf.get("mlp_bias"):
            raise ValueError("mlp_bias=True is not supported; the runner's MLP has no bias")
        if hf.get("partial_rotary_factor", 1.0) not in (None, 1.0):
            raise ValueError(f"partial_rotary_factor {hf['partial_rotary_factor']!r} is not supported (only 1.0)")
        heads = int(hf["num_attention_heads"])
        hidden = int(hf["hidden_size"])
        rope = dict(hf.get("rope_scaling") or hf.get("rope_parameters") or {})
        rope_theta = hf.get("rope_theta") or rope.get("rope_theta") or 10000.0
        attention_bias = bool(hf.get("attention_bias", False))
        return cls(
            vocab_size=int(hf["vocab_size"]),
            hidden_size=hidden,
            intermediate_size=int(hf["intermediate_size"]),
            num_layers=int(hf["num_hidden_layers"]),
            num_heads=heads,
            num_kv_heads=int(hf.get("num_key_value_heads") or heads),
            head_dim=int(hf.get("head_dim") or hidden // heads),
            rope_theta=float(rope_theta),
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-5)),
            max_position_embeddings=int(hf.get("max_position_embeddings", 2048)),
            tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
            rope_scaling=_rope_scaling(rope, hf),
            qkv_bias=arch == "qwen2" or (arch in ("llama", "qwen3") and attention_bias),
            o_bias=arch in ("llama", "qwen3") and attention_bias,
            qk_norm=arch == "qwen3",
            sliding_window=_sliding_window(arch, hf),
            model_type=arch,
        )


def _rope_scaling(rope: dict[str, Any], hf: dict[str, Any]) -> RopeScaling | None:
    kind = rope.get("rope_type") or rope.get("type") or "default"
    if kind == "default":
        return None
    if kind not in ("linear", "llama3"):
        # dynamic NTK changes the frequencies with the stream's length: keys cached under
        # one set of frequencies would be read under another
        raise ValueError(f"rope scaling {kind!r} is not supported; 'llama3' and 'linear' are (rope_scaling={rope!r})")
    if "factor" not in rope:
        raise ValueError(f"rope scaling {kind!r} needs a 'factor' (rope_scaling={rope!r})")
    return RopeScaling(
        kind=kind,
        factor=float(rope["factor"]),
        low_freq_factor=float(rope.get("low_freq_factor", 1.0)),
        high_freq_factor=float(rope.get("high_freq_factor", 4.0)),
        original_max_position_embeddings=int(
            rope.get("original_max_position_embeddings") or hf.get("max_position_embeddings", 8192)
        ),
    )


def _sliding_window(arch: str, hf: dict[str, Any]) -> int | None:
    if arch == "mistral":
        window = hf.get("sliding_window")
        return int(window) if window else None
    # Qwen: a window only where use_sliding_window (per layer in layer_types); one for some
    # layers and not others is a different model than this runner's
    layer_types = hf.get("layer_types") or ()
    if hf.get("use_sliding_window") or any(t != "full_attention" for t in layer_types):
        raise ValueError(
            f"{arch} with sliding-window layers (use_sliding_window / layer_types) is not supported; "
            "the runner's attention is full or the engine's own KVPolicy window"
        )
    return None
