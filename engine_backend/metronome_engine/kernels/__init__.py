"""Fused CPU kernels for the engine's step, compiled on first use and cached on disk.

``ops.cpp`` and ``tiles.cpp`` (the dense layers on AMX tiles, where the CPU has them) are
built once per *vector-unit build* (``Isa``):

- ``"native"``: ``-march=native``, the machine's own vector unit (AVX-512 and AMX tiles
  where it has them); ops under ``torch.ops.metronome``;
- ``"x86-64-v4"``: AVX-512 (F, BW, DQ, VL) and no AMX tiles, what AMD's Zen 4 and Zen 5 and
  Intel's Ice Lake and Cascade Lake servers run; built on any AVX-512 machine (those with
  tiles too) so that an AVX-512 machine without tiles can be reproduced on one with them;
  ops under ``torch.ops.metronome_x86_64_v4``;
- ``"x86-64-v3"``: AVX2 + FMA only, what every x86-64 machine of the last decade runs;
  built on any such machine (AVX-512 ones too) so that its figures and its tests can be
  had anywhere; ops under ``torch.ops.metronome_x86_64_v3``;
- ``"generic"``: no vector intrinsics, the plain C++ paths (16-float vectors GCC lowers
  to what the target has), which are all an aarch64 build compiles: on x86-64 built for
  the baseline (SSE2) with aarch64's unsigned ``char``, so that those paths are tested on
  any machine; ops under ``torch.ops.metronome_generic``.

On aarch64 the native build is ``-mcpu=native`` over the same plain paths; no such
machine has run it yet: ``scripts/check_aarch64_build.py`` cross-compiles every kernel
source with its flags (see docs/engine.md, "Platforms").

Each build lives in ``$METRONOME_CACHE/kernels/<key>/``, where the key covers the sources,
the flags, the torch build and the CPU, so a later start loads it in well under a second.
The builds register different op namespaces, so one process can load them all (the tests
do). A ``KernelBuild`` made for another CPU (``KernelBuild(isa, cpu=CpuInfo(...))``) says
the flags and the folder a build would have there; ``get_build`` gives this machine's.
``METRONOME_KERNELS_ISA`` picks the build an engine uses (default ``native``);
``held_env`` gives the variables that hold torch, MKL and oneDNN to a build's vector unit
too, so that a whole process runs what a machine of that kind runs.
``python -m metronome_engine.kernels [ISA ...]`` builds them ahead of time.
"""

from __future__ import annotations

import fcntl
import hashlib
import logging
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, get_args

import torch

from .. import paths
from ..cpu import CpuInfo

__all__ = [
    "ISA_ENV",
    "SOURCES",
    "CpuInfo",
    "Isa",
    "KernelBuild",
    "KernelBuildError",
    "available",
    "build_dir",
    "cannot_run",
    "compile_and_load",
    "default_isa",
    "get_build",
    "held_env",
    "load",
    "put_ninja_on_path",
    "runnable_isas",
    "tiles_available",
]

log = logging.getLogger(__name__)

Isa = Literal["native", "x86-64-v4", "x86-64-v3", "generic"]
ISAS: tuple[Isa, ...] = get_args(Isa)
ISA_ENV = "METRONOME_KERNELS_ISA"

_SOURCE_NAMES = (
    "ops.cpp",
    "tiles.cpp",
    "tiles.h",
    "groups.cpp",
    "groups.h",
    "chunk_attention.cpp",
    "chunk_attention.h",
    "checks.h",
    "vector16.h",
)
# every file a build compiles (the .cpp) or includes: its cache key covers them all
SOURCES = tuple(Path(__file__).with_name(name) for name in _SOURCE_NAMES)


class KernelBuildError(RuntimeError):
    """The fused kernels could not be compiled or loaded here (no compiler, no ninja, ...)."""


def default_isa(cpu: CpuInfo | None = None) -> Isa:
    """The build engines use: ``$METRONOME_KERNELS_ISA`` or ``"native"``; ``ValueError``
    for a name that is no build, or a build the CPU (default: this one) cannot run
    (x86-64-v3 on aarch64, x86-64-v4 without AVX-512)."""
    isa = os.environ.get(ISA_ENV) or "native"
    if isa not in ISAS:
        raise ValueError(f"{ISA_ENV} must be one of {', '.join(ISAS)}, got {isa!r}")
    why = cannot_run(isa, cpu)
    if why is not None:
        raise ValueError(f"{ISA_ENV}={isa}: {why}; unset it or use native")
    return isa


def cannot_run(isa: Isa, cpu: CpuInfo | None = None) -> str | None:
    """Why the CPU (default: this machine's) cannot run the build ``isa`` (``None``: it can):
    said before any compiler is asked, so that a wrong choice is a clear error, not a compiler's."""
    cpu = cpu or CpuInfo.here()
    if not (cpu.is_x86 or cpu.is_arm):
        return f"the kernels are built for x86-64 and aarch64 only, this CPU is {cpu.machine}"
    if isa in _NEEDS:
        if not cpu.is_x86:
            return f"the {isa} build needs an x86-64 CPU, this one is {cpu.machine}"
        lacks = sorted(_NEEDS[isa] - cpu.flags)
        if lacks:
            return f"this CPU lacks {', '.join(lacks)}: it cannot run the {isa} build"
    return None


# the CPU flags each x86-64 level's build compiles for (GCC's -march=x86-64-v3 / -v4)
_V3 = frozenset({"avx", "avx2", "fma", "f16c", "bmi1", "bmi2", "movbe"})
_NEEDS: dict[str, frozenset[str]] = {
    "x86-64-v3": _V3,
    "x86-64-v4": _V3 | {"avx512f", "avx512bw", "avx512dq", "avx512vl", "avx512cd"},
}

# what holds torch's own kernels, MKL and oneDNN to a build's vector unit: each library reads
# its variable when first used, so a process sets them before it computes (or inherits them)
_HELD_ENV: dict[str, dict[str, str]] = {
    "x86-64-v3": {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"},
    # AVX512_CORE: F/BW/DQ/VL, none of VNNI, BF16 or AMX, which machines of this kind lack
    "x86-64-v4": {
        "ATEN_CPU_CAPABILITY": "avx512",
        "MKL_ENABLE_INSTRUCTIONS": "AVX512",
        "ONEDNN_MAX_CPU_ISA": "AVX512_CORE",
    },
}
# torch.backends.cpu.get_cpu_capability() of a process held to each build
HELD_CAPABILITY: dict[str, str] = {"x86-64-v3": "AVX2", "x86-64-v4": "AVX512"}


def held_env(isa: Isa) -> dict[str, str]:
    """The environment that holds torch, MKL and oneDNN to ``isa``'s vector unit (empty for
    native, whose libraries pick the machine's own, and for generic, which has no level of
    theirs): with it and ``METRONOME_KERNELS_ISA``, a process runs what such a machine runs."""
    return dict(_HELD_ENV.get(isa, {}))


def runnable_isas(cpu: CpuInfo | None = None) -> tuple[Isa, ...]:
    """The builds the CPU (default: this machine's) can run (the ones its tests run on)."""
    return tuple(isa for isa in ISAS if cannot_run(isa, cpu) is None)


@dataclass(eq=False)
class KernelBuild:
    """One vector-unit build of the kernels: its flags, cache folder and op namespace, for
    ``cpu`` (default: this machine's) from ``sources`` (default: the package's ``SOURCES``).
    Load only the process's own (``get_build``): two loaded builds of one ``isa`` would
    register one op namespace twice."""

    isa: Isa
    cpu: CpuInfo = field(default_factory=CpuInfo.here)
    sources: tuple[Path, ...] = SOURCES
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _result: BaseException | bool | None = field(default=None, repr=False)

    @property
    def namespace(self) -> str:
        return "metronome" if self.isa == "native" else "metronome_" + self.isa.replace("-", "_")

    @property
    def ops(self) -> Any:
        """``torch.ops.<namespace>``: this build's ops (after ``load``)."""
        return getattr(torch.ops, self.namespace)

    def cflags(self) -> list[str]:
        """The compiler flags of this build on its CPU."""
        # no -ffast-math: NaN must survive, the engine's fault check looks for it.
        # hidden symbols: both builds' C++ functions share names and live in one process
        flags = ["-O3", "-fopenmp", "-fno-math-errno", "-fno-trapping-math", "-fvisibility=hidden"]
        flags.append(f"-DMETRONOME_OPS={self.namespace}")
        if self.isa == "x86-64-v3":
            flags.append("-march=x86-64-v3")
        elif self.isa == "x86-64-v4":
            flags += ["-march=x86-64-v4", "-mprefer-vector-width=512"]
        elif self.isa == "generic" and self.cpu.is_x86:
            # the baseline x86-64 (no AVX: none of the intrinsics' paths) with aarch64's unsigned char
            flags += ["-march=x86-64", "-mtune=generic", "-funsigned-char"]
        elif self.isa == "generic":
            flags += ["-march=armv8-a", "-mtune=generic"]
        elif self.cpu.is_x86:
            # GCC keeps to 256-bit vectors on some AVX-512 parts unless told; the kernels want 512
            flags += ["-march=native", "-mprefer-vector-width=512"]
        else:
            flags.append("-mcpu=native")
        return flags

    def build_dir(self) -> Path:
        """Where the build goes: ``$METRONOME_CACHE/kernels/<key>``, the key covering the
        sources, the torch build, the CPU (``CpuInfo.key``) and the flags."""
        key = hashlib.sha256()
        parts: list[bytes] = [src.read_bytes() for src in self.sources]
        parts += [torch.__version__.encode(), self.cpu.key.encode(), " ".join(self.cflags()).encode()]
        for part in parts:
            key.update(part)
        return paths.cache_dir() / "kernels" / key.hexdigest()[:16]

    def load(self) -> None:
        """Build (once per machine) and load; ``KernelBuildError`` says why not."""
        with self._lock:
            if self._result is True:
                return
            if isinstance(self._result, BaseException):
                raise KernelBuildError(str(self._result)) from self._result
            try:
                self._build_and_load()
            except Exception as exc:  # a missing compiler surfaces as many different errors
                self._result = exc
                raise KernelBuildError(f"the fused CPU kernels ({self.isa}) did not build: {exc}") from exc
            self._result = True

    def available(self) -> bool:
        """Whether this build loads here (building it if needed); never raises."""
        tried = self._result is not None
        try:
            self.load()
        except KernelBuildError as exc:
            if not tried:  # once per process, not once per engine
                log.warning("fused CPU kernels (%s) unavailable: %s", self.isa, exc)
            return False
        return True

    def tiles_available(self) -> bool:
        """Whether the dense layers can run on the CPU's matrix tiles (AMX): this build
        loads, was built with them, and the OS lets this process use them. Never raises."""
        return self.available() and bool(self.ops.tiles_ready())

    def _build_and_load(self) -> None:
        why = cannot_run(self.isa, self.cpu)
        if why is not None:
            raise RuntimeError(why)
        compile_and_load(f"{self.namespace}_kernels", self.sources, self.cflags(), self.build_dir())


def compile_and_load(name: str, sources: tuple[Path, ...], cflags: list[str], target: Path) -> None:
    """Compile the ``.cpp`` files among ``sources`` with ``cflags`` into ``target`` (once: a
    later call finds the library there) and load it into this process, with torch's builder."""
    from torch.utils import cpp_extension

    put_ninja_on_path()
    target.mkdir(parents=True, exist_ok=True)
    # torch's builder guards the folder with a bare ``lock`` file, which a build stopped midway
    # (Ctrl-C) leaves behind, and every later build waits on it forever. An flock goes with the
    # process that held it: holding ours, no build of ours is running, so a ``lock`` there is stale.
    with open(target / "build.flock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        stale = target / "lock"
        if stale.exists():
            log.warning("removing %s, left by a build that was stopped midway", stale)
            stale.unlink(missing_ok=True)
        cpp_extension.load(
            name=name,
            sources=[str(src) for src in sources if src.suffix == ".cpp"],
            extra_cflags=cflags,
            extra_ldflags=["-fopenmp"],
            build_directory=str(target),
            is_python_module=False,
            verbose=False,
        )


_builds = {isa: KernelBuild(isa) for isa in ISAS}


def get_build(isa: Isa | None = None) -> KernelBuild:
    """The build for ``isa`` (default: ``default_isa()``); one object per process."""
    isa = isa or default_isa()
    if isa not in _builds:
        raise ValueError(f"isa must be one of {', '.join(ISAS)}, got {isa!r}")
    return _builds[isa]


def build_dir() -> Path:
    """Where the default build goes (``KernelBuild.build_dir``)."""
    return get_build().build_dir()


def load() -> None:
    """Build and load the default build (``default_isa``); ``KernelBuildError`` says why not."""
    get_build().load()


def available() -> bool:
    """Whether the default build loads here; never raises."""
    return get_build().available()


def tiles_available() -> bool:
    """Whether the default build runs the dense layers on AMX tiles here; never raises."""
    return get_build().tiles_available()


def put_ninja_on_path() -> None:
    """Put the ``ninja`` pip package's binary on ``PATH``: torch's builder runs ``ninja``
    from there, and the binary is not on it when the venv is not activated."""
    try:
        import ninja  # type: ignore[import-untyped]
    except ImportError:
        return
    path = os.environ.get("PATH", "")
    if ninja.BIN_DIR not in path.split(os.pathsep):
        os.environ["PATH"] = ninja.BIN_DIR + os.pathsep + path
