"""What the sinks + window backends can run, decided before vLLM builds anything (no torch, no vLLM).

- dtype: the CUDA backend's window pass is FlashAttention's kernel, which runs fp16 and bf16
  only, and vLLM does not validate an attention backend a layer names itself: a float32
  model would fail at the first FlashAttention call. So on CUDA a windowed engine defaults
  to bfloat16 and refuses float32 up front; elsewhere float32 stays the default (the CPU
  kernel's dtype).
- KV cache dtype: the sink pass reads the cache as plain values. A quantized cache (FP8 and
  the other packed formats) holds bytes that need their scales, so the sinks would come out
  silently wrong: every backend refuses it.
- CUDA graphs: the sink pass's index follows the batch's shapes, so attention runs between
  vLLM's graphs (``PIECEWISE``), and the graphs cover a whole tick's tokens (200 sessions of
  4-token frames are 800 tokens; vLLM's default capture ends at 512, past which a step runs
  eagerly), up to ``MAX_CAPTURE_TOKENS``.
- Model runner: vLLM picks its V2 model runner on CUDA unless told otherwise, while every run
  of this backend so far (the CPU suite) used V1; the engine pins V1 (``engine_environment``).
"""

from __future__ import annotations

__all__ = ["check_kv_cache_dtype", "check_layer_dtype", "cuda_compilation", "engine_environment", "resolve_dtype"]

# the cache dtypes whose bytes are the values themselves (what the sink pass can read)
PLAIN_KV_CACHE_DTYPES = ("auto", "float16", "half", "bfloat16", "float32", "float")
_FLOAT32_NAMES = ("float32", "float")
_FLASH_DTYPES = ("float16", "bfloat16")


def resolve_dtype(dtype: str | None, *, cuda: bool, bounded: bool) -> str:
    """The model dtype an engine asks vLLM for: ``dtype`` or this platform's default, checked.

    ``None`` means bfloat16 on CUDA (FlashAttention's dtype) and float32 elsewhere. A windowed
    engine on CUDA refuses float32 (its window pass cannot run it); a full-KV one keeps vLLM's
    own attention, which picks a backend for any dtype.
    """
    if dtype is None:
        return "bfloat16" if cuda else "float32"
    if cuda and bounded and dtype in _FLOAT32_NAMES:
        raise ValueError(
            f"dtype={dtype!r}: on CUDA the sinks + window attention runs FlashAttention's kernel, "
            "which supports float16 and bfloat16 only; pass dtype='bfloat16' (the default on CUDA) "
            "or use KVPolicy.full() for a float32 run"
        )
    return dtype


def check_layer_dtype(dtype: str, *, cuda: bool) -> None:
    """Refuse a layer dtype the CUDA backend cannot run (``dtype`` as torch names it: ``"bfloat16"``)."""
    if cuda and dtype not in _FLASH_DTYPES:
        raise ValueError(
            f"the sinks + window attention on CUDA runs FlashAttention's kernel, which supports "
            f"{' and '.join(_FLASH_DTYPES)}, not {dtype}; build the engine with dtype='bfloat16'"
        )


def check_kv_cache_dtype(kv_cache_dtype: str) -> None:
    """Refuse a quantized KV cache: the sink pass would read its raw bytes without their scales."""
    if kv_cache_dtype not in PLAIN_KV_CACHE_DTYPES:
        raise ValueError(
            f"kv_cache_dtype={kv_cache_dtype!r}: the sinks + window attention reads the sinks from the "
            "cache as plain values, so a quantized cache (fp8 and other packed formats) would give "
            "wrong sinks; use kv_cache_dtype='auto' (the model's dtype)"
        )


# the largest step captured in a CUDA graph: each captured size costs start-up time and memory
MAX_CAPTURE_TOKENS = 2048
_DEFAULT_CAPTURE_TOKENS = 512  # vLLM's own ceiling on most GPUs


def cuda_compilation(max_num_batched_tokens: int) -> dict[str, object]:
    """The ``compilation_config`` a windowed engine gives vLLM on CUDA (untested: no GPU has run it)."""
    capture = max(_DEFAULT_CAPTURE_TOKENS, min(max_num_batched_tokens, MAX_CAPTURE_TOKENS))
    return {"cudagraph_mode": "PIECEWISE", "max_cudagraph_capture_size": capture}


def engine_environment() -> dict[str, str]:
    """Environment variables an engine with this backend sets before vLLM reads its own.

    - ``VLLM_ENABLE_V1_MULTIPROCESSING=0``: the backend reads vLLM's scheduler, so the engine
      core must live in this process.
    - ``VLLM_USE_V2_MODEL_RUNNER=0``: the V1 model runner, the one this backend was written
      and tested for; vLLM would otherwise pick V2 for these dense models on CUDA (on CPU,
      without Triton, it picks V1 anyway).
    """
    return {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_USE_V2_MODEL_RUNNER": "0"}
