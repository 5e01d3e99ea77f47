"""What a figure says of the CPU it came from: ``lscpu``'s model name and the vector flags
that decide which kernels run (AVX2, AVX-512, AMX tiles, NEON). A leaf: no torch.

``CpuInfo`` is what the engine reads of a CPU (its architecture and /proc/cpuinfo);
``CpuInfo.here()`` is this machine's. The kernel builds take another one to say what they
would do on a CPU this machine is not (``scripts/check_aarch64_build.py``, the tests).
"""

from __future__ import annotations

import functools
import os
import platform
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["ARM_MACHINES", "VECTOR_FLAGS", "X86_MACHINES", "CpuInfo", "describe", "model_name", "vector_flags"]

# the flags that pick a kernel path; aarch64 calls NEON "asimd" in /proc/cpuinfo
VECTOR_FLAGS = ("avx2", "avx512f", "amx_tile", "neon")
# what platform.machine() says on each architecture the kernels are built for
X86_MACHINES = ("x86_64", "AMD64")
ARM_MACHINES = ("aarch64", "arm64")
# the lines of /proc/cpuinfo that say what a native build may use: x86's "flags"; aarch64's
# "Features" (SVE, dot products, ...) and which core it is, which -mcpu=native tunes for
_KEY_FIELDS = ("flags", "Features", "CPU implementer", "CPU architecture", "CPU variant", "CPU part")


@dataclass(frozen=True, slots=True)
class CpuInfo:
    """A CPU as the engine sees it: ``machine`` (``platform.machine()``: ``"x86_64"``,
    ``"aarch64"``, ...), ``cpuinfo`` (the text of /proc/cpuinfo, empty where there is none)
    and ``processor`` (``platform.processor()``, the last resort of ``key``)."""

    machine: str
    cpuinfo: str = field(default="", repr=False)  # a few kB a core: not in every log line
    processor: str = ""

    @classmethod
    def here(cls) -> CpuInfo:
        """This machine's CPU (read once a process: it does not change under it)."""
        return _here()

    def field(self, *names: str) -> str | None:
        """The value of the first line of /proc/cpuinfo named one of ``names`` (the first CPU's)."""
        for line in self.cpuinfo.splitlines():
            name, _, value = line.partition(":")
            if name.strip() in names:
                return value.strip()
        return None

    @property
    def flags(self) -> frozenset[str]:
        """The instruction-set flags: x86's ``flags``, aarch64's ``Features``."""
        return frozenset((self.field("flags", "Features") or "").split())

    @property
    def is_x86(self) -> bool:
        return self.machine in X86_MACHINES

    @property
    def is_arm(self) -> bool:
        return self.machine in ARM_MACHINES

    @property
    def key(self) -> str:
        """What a kernel build's cache key knows of this CPU: a build for one CPU must never
        load on another that lacks its instructions (a home folder shared by an x86 and an
        ARM machine, or by two ARM cores of different generations)."""
        found: dict[str, str] = {}
        for line in self.cpuinfo.splitlines():
            name = line.split(":", 1)[0].strip()
            if name in _KEY_FIELDS and name not in found:  # the first CPU's
                found[name] = line
        return "\n".join(found.values()) or self.processor or self.machine


@functools.cache
def _here() -> CpuInfo:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        text = ""
    info = CpuInfo(platform.machine(), text)
    if info.key != info.machine:
        return info
    return CpuInfo(info.machine, text, platform.processor())  # runs `uname -p`: only when needed


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
    return CpuInfo.here().field("model name", "Model") or platform.processor() or platform.machine()


def vector_flags(cpu: CpuInfo | None = None) -> dict[str, bool]:
    """Which of ``VECTOR_FLAGS`` the CPU (default: this one) has, from its flags or Features."""
    cpu = cpu or CpuInfo.here()
    flags = set(cpu.flags)
    if "asimd" in flags or cpu.is_arm:
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
