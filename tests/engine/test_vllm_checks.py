"""The vLLM backend's start-up decisions (``vllm_backend.checks``): pure Python, no vLLM, no CUDA."""

from __future__ import annotations

import subprocess
import sys

import pytest

from metronome_engine.vllm_backend.checks import (
    check_kv_cache_dtype,
    check_layer_dtype,
    cuda_compilation,
    engine_environment,
    resolve_dtype,
)


def test_cuda_defaults_to_bfloat16_and_cpu_to_float32() -> None:
    assert resolve_dtype(None, cuda=True, bounded=True) == "bfloat16"
    assert resolve_dtype(None, cuda=True, bounded=False) == "bfloat16"
    assert resolve_dtype(None, cuda=False, bounded=True) == "float32"


@pytest.mark.parametrize("name", ["float32", "float"])
def test_windowed_engine_on_cuda_refuses_float32_naming_the_fix(name: str) -> None:
    with pytest.raises(ValueError, match=r"FlashAttention.*dtype='bfloat16'"):
        resolve_dtype(name, cuda=True, bounded=True)


def test_float32_stays_allowed_where_a_backend_runs_it() -> None:
    assert resolve_dtype("float32", cuda=False, bounded=True) == "float32"  # the CPU kernel's dtype
    assert resolve_dtype("float32", cuda=True, bounded=False) == "float32"  # vLLM's own attention
    assert resolve_dtype("float16", cuda=True, bounded=True) == "float16"


def test_layer_dtype_on_cuda_is_flash_attentions() -> None:
    check_layer_dtype("bfloat16", cuda=True)
    check_layer_dtype("float16", cuda=True)
    check_layer_dtype("float32", cuda=False)
    with pytest.raises(ValueError, match=r"not float32; build the engine with dtype='bfloat16'"):
        check_layer_dtype("float32", cuda=True)


@pytest.mark.parametrize("name", ["fp8", "fp8_e4m3", "fp8_e5m2", "fp8_inc", "nvfp4", "int8_per_token_head"])
def test_quantized_kv_cache_is_refused(name: str) -> None:
    with pytest.raises(ValueError, match=rf"kv_cache_dtype='{name}'.*wrong sinks.*kv_cache_dtype='auto'"):
        check_kv_cache_dtype(name)


@pytest.mark.parametrize("name", ["auto", "float16", "bfloat16", "float32"])
def test_plain_kv_cache_is_accepted(name: str) -> None:
    check_kv_cache_dtype(name)


def test_engine_pins_the_v1_model_runner_in_process() -> None:
    assert engine_environment() == {"VLLM_ENABLE_V1_MULTIPROCESSING": "0", "VLLM_USE_V2_MODEL_RUNNER": "0"}


def test_cuda_graphs_are_piecewise_and_cover_a_tick() -> None:
    # 200 sessions of 4-token frames: 800 tokens, past vLLM's default capture ceiling of 512
    assert cuda_compilation(800) == {"cudagraph_mode": "PIECEWISE", "max_cudagraph_capture_size": 800}
    assert cuda_compilation(64)["max_cudagraph_capture_size"] == 512  # never below vLLM's own default
    assert cuda_compilation(65_536)["max_cudagraph_capture_size"] == 2048  # capture time and memory bounded


def test_checks_import_without_torch_or_vllm() -> None:
    code = (
        "import sys; import metronome_engine.vllm_backend.checks; "
        "bad = {'torch', 'vllm'} & set(sys.modules); assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)
