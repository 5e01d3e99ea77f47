"""Cross-compile every kernel source the engine builds for aarch64, with the flags the
build uses there, and check that every symbol the objects need resolves.

    nice -n 10 python scripts/check_aarch64_build.py [--cxx aarch64-linux-gnu-g++] [--keep DIR]

No aarch64 machine has run the kernels (see docs/engine.md, "Platforms"); this is the
check that stands in for one. It needs a cross compiler, which no make target installs:
``apt-get install -y g++-aarch64-linux-gnu`` (Debian). Without it the script says so and
exits 2: nothing was checked.

What it does, per build an aarch64 machine would make (the engine's ``native`` and
``generic`` builds, and vLLM's sinks + window kernel):

- asks ``metronome_engine`` for the flags it passes on aarch64 (its builds made for a
  ``CpuInfo("aarch64")``), with ``-mcpu=native`` made ``-mcpu=generic``
  (a cross compiler cannot read the target's CPU);
- has torch write the ninja file its ``cpp_extension.load`` writes (the same defines,
  torch's include paths and the Python headers, ``-fPIC -std=c++20``), with ``CXX`` the
  cross compiler, and builds its objects (not the library: there is no aarch64 libtorch
  here to link against);
- checks that each object is an AArch64 ELF file, and that every symbol the objects leave
  undefined is defined by another of them, by torch's libraries (their exported names
  here, which are the same on aarch64) or by aarch64's C, C++ and OpenMP runtimes: the
  link an aarch64 machine would do, but for its addresses.

What it cannot say: that the code runs correctly there. ``aarch64_emulated/run.sh`` runs
it under qemu against the x86-64 generic build's outputs, and the ``generic`` build runs
the same source paths on x86-64 in the kernel tests (with aarch64's unsigned ``char``);
the memory ordering of ARM's atomics and ``-mcpu=native`` on a real core wait for one.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(_ROOT / "engine_backend"))

from metronome_engine import kernels  # noqa: E402
from metronome_engine.vllm_backend import native  # noqa: E402

_AARCH64_MACHINE = 183  # ELF e_machine of AArch64
_RUNTIMES = ("libc.so.6", "libm.so.6", "libstdc++.so.6", "libgcc_s.so.1", "libgomp.so.1")
_TORCH_LIBS = ("libc10.so", "libtorch_cpu.so", "libtorch.so", "libtorch_python.so")


_AARCH64 = kernels.CpuInfo("aarch64")


def builds() -> dict[str, tuple[list[Path], list[str]]]:
    """Build name -> (its .cpp sources, the flags an aarch64 machine passes)."""
    compiled = [s for s in kernels.SOURCES if s.suffix == ".cpp"]
    out: dict[str, tuple[list[Path], list[str]]] = {
        isa: (compiled, kernels.KernelBuild(isa, cpu=_AARCH64).cflags())
        for isa in kernels.ISAS
        if kernels.cannot_run(isa, _AARCH64) is None
    }
    # vLLM's kernel takes the flags of the build engines use by default: native
    vllm = native.SinkWindowBuild(kernels.KernelBuild("native", cpu=_AARCH64))
    out["vllm"] = ([s for s in vllm.sources if s.suffix == ".cpp"], vllm.cflags())
    return {
        name: (srcs, ["-mcpu=generic" if f == "-mcpu=native" else f for f in flags])
        for name, (srcs, flags) in out.items()
    }


def compile_build(name: str, sources: list[Path], flags: list[str], cxx: str, folder: Path) -> list[Path]:
    """The objects of one build, compiled by ``cxx`` from the ninja file torch writes."""
    from torch.utils import cpp_extension

    folder.mkdir(parents=True, exist_ok=True)
    os.environ["CXX"] = cxx
    try:  # a private function of torch: the one its load() calls, so the flags are the same
        cpp_extension._write_ninja_file_to_build_library(
            path=str(folder / "build.ninja"),
            name=f"metronome_{name.replace('-', '_')}_kernels",
            sources=[str(s) for s in sources],
            extra_cflags=flags,
            extra_cuda_cflags=[],
            extra_sycl_cflags=[],
            extra_ldflags=["-fopenmp"],
            extra_include_paths=[],
            with_cuda=False,
            with_sycl=False,
            is_standalone=False,
        )
    except TypeError as exc:
        raise SystemExit(f"torch's cpp_extension writes its ninja file differently now ({exc})") from exc
    ninja = (folder / "build.ninja").read_text()
    objects = re.findall(r"^build (\S+\.o): compile ", ninja, flags=re.M)
    if len(objects) != len(sources):
        raise SystemExit(f"{name}: expected {len(sources)} objects in torch's ninja file, found {objects}")
    kernels.put_ninja_on_path()
    done = subprocess.run(["ninja", "-C", str(folder), "-j", "2", *objects], capture_output=True, text=True)
    if done.returncode != 0:
        print(done.stdout[-6000:], done.stderr[-2000:], sep="\n")
        raise SystemExit(f"{name}: the aarch64 build failed (flags: {' '.join(flags)})")
    return [folder / o for o in objects]


def _elf_machine(path: Path) -> int:
    head = path.read_bytes()[:20]
    if head[:4] != b"\x7fELF":
        return -1
    return int.from_bytes(head[18:20], "little" if head[5] == 1 else "big")


def _symbols(nm: str, paths: list[Path], *flags: str) -> set[str]:
    """The names nm lists; of undefined ones, those a link must resolve ("U", not weak "w")."""
    done = subprocess.run([nm, *flags, *map(str, paths)], capture_output=True, text=True, check=True)
    rows = [line.split() for line in done.stdout.splitlines() if line.strip() and not line.endswith(":")]
    return {row[-1] for row in rows if "--undefined-only" not in flags or row[-2] == "U"}


def unresolved(objects: list[Path], nm: str, sysroot: Path, runtime_dir: Path) -> set[str]:
    """The symbols the objects need that nothing an aarch64 link would see defines."""
    import torch

    needed = _symbols(nm, objects, "--undefined-only")
    defined = _symbols(nm, objects, "--defined-only")
    torch_lib = Path(torch.__file__).parent / "lib"
    # torch's libraries here are x86-64 ones: the host's nm reads their exported names
    defined |= _symbols("nm", [torch_lib / lib for lib in _TORCH_LIBS], "-D", "--defined-only")
    runtimes = [p for lib in _RUNTIMES for p in (sysroot / "lib" / lib, runtime_dir / lib) if p.exists()]
    defined |= _symbols(nm, runtimes, "-D", "--defined-only")
    # what g++ links in statically: libgcc's outline atomics (__aarch64_ldadd4_acq_rel), crtbeginS's __dso_handle
    static = [runtime_dir / name for name in ("libgcc.a", "crtbeginS.o") if (runtime_dir / name).exists()]
    defined |= _symbols(nm, static, "--defined-only")
    # versioned names (memcpy@GLIBC_2.17) and the linker's own (_GLOBAL_OFFSET_TABLE_)
    defined = {s.split("@")[0] for s in defined}
    return {s for s in needed if s.split("@")[0] not in defined and s != "_GLOBAL_OFFSET_TABLE_"}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cxx", default="aarch64-linux-gnu-g++", help="the cross compiler (default: Debian's)")
    parser.add_argument("--keep", type=Path, default=None, help="build in this folder and keep it")
    args = parser.parse_args()
    cxx = shutil.which(args.cxx)
    if cxx is None:
        print(f"no {args.cxx}: apt-get install -y g++-aarch64-linux-gnu; nothing was checked", file=sys.stderr)
        return 2
    prefix = Path(cxx).name.removesuffix("g++")  # aarch64-linux-gnu-
    nm = shutil.which(prefix + "nm") or "nm"
    sysroot = Path("/usr") / prefix.rstrip("-")
    libgcc = subprocess.run([cxx, "-print-libgcc-file-name"], capture_output=True, text=True, check=True)
    runtime_dir = Path(libgcc.stdout.strip()).parent
    with tempfile.TemporaryDirectory(prefix="aarch64-kernels-") as tmp:
        root = args.keep or Path(tmp)
        every: list[Path] = []
        for name, (sources, flags) in builds().items():
            objects = compile_build(name, sources, flags, cxx, root / name)
            wrong = [o.name for o in objects if _elf_machine(o) != _AARCH64_MACHINE]
            if wrong:
                raise SystemExit(f"{name}: not AArch64 objects: {wrong}")
            missing = unresolved(objects, nm, sysroot, runtime_dir)
            if missing:
                print(f"{name}: symbols nothing defines on aarch64:", *sorted(missing)[:40], sep="\n  ")
                return 1
            print(f"{name}: {', '.join(s.name for s in sources)} -> AArch64 objects; flags {' '.join(flags)}")
            every += objects
    print(f"every kernel source compiled for aarch64 ({len(every)} objects) and every symbol they need resolves")
    return 0


if __name__ == "__main__":
    sys.exit(main())
