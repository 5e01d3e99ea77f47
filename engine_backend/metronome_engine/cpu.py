"""What a figure says of the CPU it came from: ``lscpu``'s model name and the vector flags
that decide which kernels run (AVX2, AVX-512, AMX tiles, NEON). A leaf: no torch."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
from pathlib import Path

__all__ = ["VECTOR_FLAGS", "describe", "model_name", "vector_flags"]

# the flags that pick a kernel path; aarch64 calls NEON "asimd" in /proc/cpuinfo
VECTOR_FLAGS = ("avx2", "avx512f", "amx_tile", "neon")
_CPUINFO = Path("/proc/cpuinfo")


def _cpuinfo_field(*keys: str) -> str | None:
    try:
        text = _CPUINFO.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in keys:
            return value.strip()
    return None


def model_name() -> str:
    """``lscpu``'s "Model name" (it names ARM cores that /proc/cpuinfo only numbers), else
    /proc/cpuinfo's, else what ``platform`` says."""
    lscpu = shutil.which("lscpu")
    if lscpu is not None:
        try:
            out = subprocess.run([lscpu], capture_output=True, text=True, timeout=10, check=False).stdout
        except (OSError, subprocess.SubprocessError):
            out = ""
        for line in out.splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "Model name" and value.strip():
                return value.strip()
    return _cpuinfo_field("model name", "Model") or platform.processor() or platform.machine()


def vector_flags() -> dict[str, bool]:
    """Which of ``VECTOR_FLAGS`` this CPU has (from /proc/cpuinfo's flags or Features)."""
    flags = set((_cpuinfo_field("flags", "Features") or "").split())
    if "asimd" in flags or platform.machine() in ("aarch64", "arm64"):
        flags.add("neon")  # every aarch64 core has it
    return {name: name in flags for name in VECTOR_FLAGS}


def describe() -> dict[str, object]:
    """The machine part of a benchmark's JSON: the CPU's model name, its vector flags, cores."""
    return {
        "cpu": model_name(),
        "arch": platform.machine(),
        "vector_flags": vector_flags(),
        "cores": os.cpu_count(),
    }
