"""Fused CPU kernels for the engine's step, compiled on first use and cached on disk.

``ops.cpp`` and ``tiles.cpp`` (the dense layers on AMX tiles, where the CPU has them) are
built with the machine's own vector unit (``-march=native``) into
``$METRONOME_CACHE/kernels/<key>/``, where the key covers the sources, the torch build and
the CPU, so a later start loads the built library in well under a second. Loading
registers the ops under ``torch.ops.metronome``. ``python -m metronome_engine.kernels``
builds them ahead of time (the Makefile's set-up does).
"""

from __future__ import annotations

import hashlib
import logging
import os
import platform
import threading
from pathlib import Path

import torch

__all__ = ["KernelBuildError", "available", "load", "tiles_available"]

log = logging.getLogger(__name__)

_SOURCES = [Path(__file__).with_name(name) for name in ("ops.cpp", "tiles.cpp", "tiles.h", "checks.h")]
_lock = threading.Lock()
_state: dict[str, BaseException | bool] = {}


class KernelBuildError(RuntimeError):
    """The fused kernels could not be compiled or loaded here (no compiler, no ninja, ...)."""


def _cpu_flags() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.processor()


def _cflags() -> list[str]:
    # no -ffast-math: NaN must survive, the engine's fault check looks for it
    flags = ["-O3", "-fopenmp", "-fno-math-errno", "-fno-trapping-math"]
    if platform.machine() in ("x86_64", "AMD64"):
        # GCC keeps to 256-bit vectors on some AVX-512 parts unless told; the kernels want 512
        flags += ["-march=native", "-mprefer-vector-width=512"]
    else:
        flags.append("-mcpu=native")
    return flags


def build_dir() -> Path:
    from ..weights import cache_dir

    key = hashlib.sha256()
    parts: list[bytes] = [src.read_bytes() for src in _SOURCES]
    parts += [torch.__version__.encode(), _cpu_flags().encode(), " ".join(_cflags()).encode()]
    for part in parts:
        key.update(part)
    return cache_dir() / "kernels" / key.hexdigest()[:16]


def load() -> None:
    """Build (once per machine) and load the kernels; ``KernelBuildError`` says why not."""
    with _lock:
        done = _state.get("result")
        if done is True:
            return
        if isinstance(done, BaseException):
            raise KernelBuildError(str(done)) from done
        try:
            _build_and_load()
        except Exception as exc:  # a missing compiler surfaces as many different errors
            _state["result"] = exc
            raise KernelBuildError(f"the fused CPU kernels did not build: {exc}") from exc
        _state["result"] = True


def available() -> bool:
    """Whether the kernels load here (building them if needed); never raises."""
    tried = "result" in _state
    try:
        load()
    except KernelBuildError as exc:
        if not tried:  # once per process, not once per engine
            log.warning("fused CPU kernels unavailable, using the torch path: %s", exc)
        return False
    return True


def _put_ninja_on_path() -> None:
    # torch's builder runs `ninja` from PATH; the pip package's binary is not on it when
    # the venv is not activated
    try:
        import ninja  # type: ignore[import-untyped]
    except ImportError:
        return
    path = os.environ.get("PATH", "")
    if ninja.BIN_DIR not in path.split(os.pathsep):
        os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + path


def _build_and_load() -> None:
    from torch.utils import cpp_extension

    if platform.machine() not in ("x86_64", "AMD64", "aarch64", "arm64"):
        raise RuntimeError(f"no kernel build for {platform.machine()}")
    _put_ninja_on_path()
    target = build_dir()
    target.mkdir(parents=True, exist_ok=True)
    cpp_extension.load(
        name="metronome_kernels",
        sources=[str(src) for src in _SOURCES if src.suffix == ".cpp"],
        extra_cflags=_cflags(),
        extra_ldflags=["-fopenmp"],
        build_directory=str(target),
        is_python_module=False,
        verbose=False,
    )


def tiles_available() -> bool:
    """Whether the dense layers can run on the CPU's matrix tiles (AMX) here: the kernels
    load, were built with them, and the OS lets this process use them. Never raises."""
    return available() and bool(torch.ops.metronome.tiles_ready())
