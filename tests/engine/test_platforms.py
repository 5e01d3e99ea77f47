"""The kernels' build on a CPU this machine is not: aarch64 and other x86-64 CPUs, given to
the builds as a ``CpuInfo`` (an architecture and a /proc/cpuinfo), with a compiler that fails
as a cross one would (``CXX``: ``tests/support/compiler.py``).

No aarch64 machine has run the kernels: ``scripts/check_aarch64_build.py`` cross-compiles
them (a slow test here runs it, skipped where the cross compiler is absent),
``scripts/aarch64_emulated/run.sh`` runs them under qemu (by hand: it needs root and a
430 MB wheel), the ``generic`` build runs their plain paths on any machine
(test_fused_kernels.py, test_groups.py), and this module checks what the Python around the build does there:
the flags, the cache key, the builds it offers, and what a failed build says.
"""

from __future__ import annotations

import logging
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from metronome_engine import cpu, kernels
from metronome_engine.cpu import CpuInfo
from metronome_engine.kernels import KernelBuild, KernelBuildError
from metronome_engine.vllm_backend import native
from tests.support import FailingCompiler

# the first CPU of a Neoverse-N1 (Graviton2) and of a Neoverse-V1 (Graviton3: SVE)
_N1 = """processor\t: 0
BogoMIPS\t: 243.75
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp ssbs
CPU implementer\t: 0x41
CPU architecture: 8
CPU variant\t: 0x3
CPU part\t: 0xd0c
CPU revision\t: 1
"""
_V1 = _N1.replace("ssbs", "ssbs sve svebf16 i8mm bf16").replace("0xd0c", "0xd40").replace("0x3", "0x1")
# three x86-64 CPUs' flags (the parts that matter): AVX2 only (Zen 2/3), AVX-512 without
# tiles (Zen 4, Ice Lake), AVX-512 with AMX tiles (Sapphire Rapids)
_AVX2 = "flags\t\t: fpu sse sse2 ssse3 sse4_1 sse4_2 popcnt avx f16c fma bmi1 bmi2 movbe avx2\n"
_AVX512 = _AVX2.replace("avx2", "avx2 avx512f avx512dq avx512cd avx512bw avx512vl avx512_vnni avx512_bf16")
_AMX = _AVX512.replace("avx512_bf16", "avx512_bf16 amx_bf16 amx_tile amx_int8")
_ROOT = Path(__file__).parents[2]
_SCRIPT = _ROOT / "scripts" / "check_aarch64_build.py"


@pytest.fixture
def compiler(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FailingCompiler:
    """Builds go to a fresh cache (``METRONOME_CACHE``) and are compiled by a compiler that fails."""
    fake = FailingCompiler(tmp_path / "bin")
    monkeypatch.setenv("CXX", str(fake.path))
    monkeypatch.setenv("METRONOME_CACHE", str(tmp_path / "cache"))
    return fake


N1 = CpuInfo("aarch64", _N1)


def test_aarch64_builds_pass_no_x86_flag() -> None:
    assert kernels.runnable_isas(N1) == ("native", "generic")
    native_flags, generic_flags = KernelBuild("native", cpu=N1).cflags(), KernelBuild("generic", cpu=N1).cflags()
    assert "-mcpu=native" in native_flags and "-march=armv8-a" in generic_flags
    vllm_flags = native.SinkWindowBuild(KernelBuild("native", cpu=N1)).cflags()
    for flags in (native_flags, generic_flags, vllm_flags):
        assert not [f for f in flags if "x86" in f or "vector-width" in f or f == "-march=native"], flags


def test_vllms_kernel_takes_the_flags_of_the_build_engines_use(monkeypatch: pytest.MonkeyPatch) -> None:
    # one variable says which vector unit the whole process runs: an AVX2 or aarch64 run everywhere
    for isa in kernels.runnable_isas():
        monkeypatch.setenv(kernels.ISA_ENV, isa)
        engine_flags = KernelBuild(isa).cflags()
        assert native.SinkWindowBuild().cflags() == [f for f in engine_flags if not f.startswith("-DMETRONOME_OPS=")]
    keys = set()
    for isa in kernels.runnable_isas():
        monkeypatch.setenv(kernels.ISA_ENV, isa)
        keys.add(native.SinkWindowBuild().build_dir())
    assert len(keys) == len(kernels.runnable_isas())


@pytest.mark.parametrize(
    ("machine", "text", "isa", "said"),
    [
        ("aarch64", _N1, "x86-64-v3", "the x86-64-v3 build needs an x86-64 CPU, this one is aarch64"),
        (
            "x86_64",
            _AVX2,
            "x86-64-v4",
            "this CPU lacks avx512bw, avx512cd, avx512dq, avx512f, avx512vl: it cannot run the x86-64-v4 build",
        ),
    ],
    ids=["x86-64-v3-on-aarch64", "x86-64-v4-on-avx2"],
)
def test_a_build_the_cpu_cannot_run_is_refused_before_any_compiler(
    compiler: FailingCompiler,
    monkeypatch: pytest.MonkeyPatch,
    machine: str,
    text: str,
    isa: kernels.Isa,
    said: str,
) -> None:
    info = CpuInfo(machine, text)
    assert kernels.cannot_run(isa, info) == said
    with pytest.raises(KernelBuildError, match=said):
        KernelBuild(isa, cpu=info).load()
    monkeypatch.setenv(kernels.ISA_ENV, isa)
    with pytest.raises(ValueError, match=f"METRONOME_KERNELS_ISA={isa}: {said}; unset it or use native"):
        kernels.default_isa(info)
    assert compiler.calls == []


@pytest.mark.parametrize(
    ("flags", "builds", "vector"),
    [
        (_AVX2, ("native", "x86-64-v3", "generic"), {"avx2"}),
        (_AVX512, ("native", "x86-64-v4", "x86-64-v3", "generic"), {"avx2", "avx512f"}),
        (_AMX, ("native", "x86-64-v4", "x86-64-v3", "generic"), {"avx2", "avx512f", "amx_tile"}),
    ],
    ids=["avx2", "avx512", "avx512+amx"],
)
def test_each_x86_cpu_offers_the_builds_it_can_run(flags: str, builds: tuple[str, ...], vector: set[str]) -> None:
    info = CpuInfo("x86_64", flags)
    assert kernels.runnable_isas(info) == builds
    assert {name for name, has in cpu.vector_flags(info).items() if has} == vector


def test_x86_64_v4_is_avx512_without_tiles_with_its_libraries_held_to_it() -> None:
    flags = KernelBuild("x86-64-v4").cflags()
    assert "-march=x86-64-v4" in flags and "-mprefer-vector-width=512" in flags
    assert not [f for f in flags if "amx" in f or f == "-march=native"], flags
    # torch, MKL and oneDNN held to AVX-512 without VNNI, BF16 or AMX; native holds nothing
    assert kernels.held_env("x86-64-v4") == {
        "ATEN_CPU_CAPABILITY": "avx512",
        "MKL_ENABLE_INSTRUCTIONS": "AVX512",
        "ONEDNN_MAX_CPU_ISA": "AVX512_CORE",
    }
    assert kernels.held_env("x86-64-v3")["ONEDNN_MAX_CPU_ISA"] == "AVX2" and kernels.held_env("native") == {}


def test_an_unknown_architecture_is_refused_by_name(compiler: FailingCompiler) -> None:
    riscv = CpuInfo("riscv64")
    assert kernels.runnable_isas(riscv) == ()
    with pytest.raises(KernelBuildError, match="built for x86-64 and aarch64 only, this CPU is riscv64"):
        KernelBuild("native", cpu=riscv).load()
    assert compiler.calls == []


def test_the_cache_key_tells_arm_cores_apart() -> None:
    # a native build for a core with SVE must not load on one without it (a shared home folder)
    def folders(info: CpuInfo) -> list[Path]:
        builds = [KernelBuild(isa, cpu=info) for isa in ("native", "generic")]
        return [b.build_dir() for b in builds] + [native.SinkWindowBuild(builds[0]).build_dir()]

    v1 = CpuInfo("aarch64", _V1)
    n1, later = folders(N1), folders(v1)
    assert not set(n1) & set(later) and len(set(n1)) == 3
    assert "Features" in v1.key and "0xd40" in v1.key


def test_where_the_build_fails_it_says_why_once_and_keeps_the_failure(
    compiler: FailingCompiler, caplog: pytest.LogCaptureFixture
) -> None:
    # what kernels="auto" meets on such a machine (it then runs torch: test_fused_kernels.py)
    build = KernelBuild("native", cpu=N1)
    with caplog.at_level(logging.WARNING, logger="metronome_engine.kernels"):
        assert not build.available()
    assert compiler.calls and all("-mcpu=native" in call for call in compiler.calls)  # aarch64's flags
    assert "fused CPU kernels (native) unavailable" in caplog.text and "unknown value 'native'" in caplog.text
    tried = len(compiler.calls)
    caplog.clear()
    assert not build.available()
    with pytest.raises(KernelBuildError, match="unknown value 'native' for -mcpu"):
        build.load()
    assert len(compiler.calls) == tried and "unavailable" not in caplog.text  # kept: not a compile per engine


def test_where_vllms_kernel_fails_to_build_it_says_so(
    compiler: FailingCompiler, caplog: pytest.LogCaptureFixture
) -> None:
    build = native.SinkWindowBuild(KernelBuild("native", cpu=N1))
    with caplog.at_level(logging.WARNING, logger=native.__name__):
        assert build.available() is False
    assert compiler.calls and all("-mcpu=native" in call for call in compiler.calls)
    assert "using the torch pass" in caplog.text


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_every_kernel_source_cross_compiles_for_aarch64() -> None:
    # a skip is not a pass: without the cross compiler nothing was checked (docs/engine.md)
    if shutil.which("aarch64-linux-gnu-g++") is None:
        pytest.skip("no aarch64 cross compiler: apt-get install g++-aarch64-linux-gnu to run this check")
    done = subprocess.run([sys.executable, str(_SCRIPT)], capture_output=True, text=True, timeout=880, check=False)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "every kernel source compiled for aarch64" in done.stdout
