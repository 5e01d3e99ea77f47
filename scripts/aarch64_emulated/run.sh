#!/bin/sh
# Runs the kernels' aarch64 build under qemu's user-mode emulation and checks its ops against
# the x86-64 generic build (the same source paths, tested against torch here):
#
#   sudo apt-get install -y g++-aarch64-linux-gnu qemu-user-static
#   nice -n 10 sh scripts/aarch64_emulated/run.sh          # as root: it fakes /proc/cpuinfo, see below
#
# 1. record_ops.py records every op call of a tiny engine's scripted steps (full and window
#    policies: decoder_layers, rms_norm, greedy_rows) and direct calls (group_linear on 4- and
#    8-bit blocks, silu_mul with NaN and clamped gates) on the x86-64 generic build: inputs
#    before, outputs and written-into inputs after;
# 2. the kernel sources are cross-compiled twice, as the native build on a Neoverse-N1 would
#    be (-mcpu=neoverse-n1: NEON, dot products, LSE atomics) and as the generic build
#    (-march=armv8-a), against an aarch64 torch wheel's headers (pip downloads the host's torch
#    version for manylinux aarch64, about 430 MB, once) and linked with replay.cpp and the
#    wheel's libtorch_cpu; that wheel is a CUDA build, so the two CUDA libraries libtorch_cpu
#    names (libcudart, libcupti) are stubbed: nothing here calls them;
# 3. qemu-aarch64-static runs the replay. torch's CPU probes (cpuinfo, oneDNN's xbyak) read
#    ARM's /proc/cpuinfo and sysfs entries that an x86 host lacks and crash without them,
#    so the run sits in a private mount namespace (unshare -m: root) where a Neoverse-N1's
#    are bound over the host's.
#
# It fails (exit 1) when any output differs by more than 1e-4 of its largest value, an
# integer or a NaN's place differs. What it cannot show: the memory ordering of a real ARM
# core (qemu runs the threads on x86's stronger model) or its speed.
set -eu
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
WORK=${WORK:-/tmp/metronome-aarch64}
PY=${PYTHON:-python}
CXX=${CXX:-aarch64-linux-gnu-g++}
CC=${CC_ARM:-aarch64-linux-gnu-gcc}
mkdir -p "$WORK/wheel" "$WORK/obj" "$WORK/stubs" "$WORK/fake"
export PYTHONPATH="$ROOT/src:$ROOT/engine_backend${PYTHONPATH:+:$PYTHONPATH}"

version=$("$PY" -c 'import torch; print(torch.__version__.split("+")[0])')
pyver=$("$PY" -c 'import sys; print(f"{sys.version_info[0]}{sys.version_info[1]}")')
if [ ! -f "$WORK/site/torch/lib/libtorch_cpu.so" ]; then
  "$PY" -m pip download --quiet --only-binary=:all: --platform manylinux_2_28_aarch64 --python-version "$pyver" \
    --implementation cp --abi "cp$pyver" --no-deps "torch==$version" -d "$WORK/wheel"
  rm -rf "$WORK/site" && mkdir -p "$WORK/site"
  "$PY" -m zipfile -e "$WORK"/wheel/torch-"$version"-*aarch64.whl "$WORK/site"
fi
TI="$WORK/site/torch/include"
TL="$WORK/site/torch/lib"

# stubs for the CUDA libraries libtorch_cpu and libc10 name, with their symbol versions
for lib in libcudart.so libcupti.so; do
  soname=$(readelf -d "$TL/libtorch_cpu.so" | sed -n "s/.*Shared library: \[\($lib\.[0-9]*\)\].*/\1/p")
  [ -n "$soname" ] || continue
  readelf --dyn-syms -W "$TL/libtorch_cpu.so" "$TL/libc10.so" | awk -v v="@$soname" '$7 == "UND" && index($8, v) {
    split($8, a, "@"); print "int " a[1] "(void) { return 999; }" }' | sort -u > "$WORK/stubs/$lib.c"
  echo "$soname { global: *; };" > "$WORK/stubs/$lib.map"
  "$CC" -shared -fPIC -o "$WORK/stubs/$soname" "$WORK/stubs/$lib.c" -Wl,-soname,"$soname" \
    -Wl,--version-script="$WORK/stubs/$lib.map"
done

echo "recording the x86-64 generic build's op calls"
rm -rf "$WORK/calls"
"$PY" "$ROOT/scripts/aarch64_emulated/record_ops.py" "$WORK/calls"

K="$ROOT/engine_backend/metronome_engine/kernels"
flags="-isystem $TI -isystem $TI/torch/csrc/api/include -fPIC -std=c++20"
"$CXX" $flags -O1 -c "$ROOT/scripts/aarch64_emulated/replay.cpp" -o "$WORK/replay.o"
# the native build's flags on a Neoverse-N1 (kernels.KernelBuild.cflags, its -mcpu named), and the generic build's
for arch in -mcpu=neoverse-n1 -march=armv8-a; do
  echo "cross-compiling the kernels for aarch64 ($arch)"
  out="$WORK/obj/${arch#*=}"
  mkdir -p "$out"
  for src in "$K"/*.cpp; do
    "$CXX" $flags -O3 -fopenmp -fno-math-errno -fno-trapping-math -fvisibility=hidden -DMETRONOME_OPS=metronome \
      $arch -c "$src" -o "$out/$(basename "$src" .cpp).o"
  done
  "$CXX" -fopenmp "$out"/*.o "$WORK/replay.o" -o "$out/replay" -L"$TL" -L"$WORK/stubs" -ltorch_cpu -lc10 \
    -Wl,-rpath-link,"$TL" -Wl,-rpath-link,"$WORK/stubs"
done

# a Neoverse-N1's /proc/cpuinfo and sysfs identification, for the private mount namespace
: > "$WORK/fake/cpuinfo"
for c in 0 1; do
  printf 'processor\t: %d\nBogoMIPS\t: 243.75\nFeatures\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm lrcpc dcpop asimddp ssbs\nCPU implementer\t: 0x41\nCPU architecture: 8\nCPU variant\t: 0x3\nCPU part\t: 0xd0c\nCPU revision\t: 1\n\n' $c >> "$WORK/fake/cpuinfo"
done
cat > "$WORK/fake/enter.sh" <<INNER
set -e
for c in 0 1; do
  d="$WORK/fake/cpu\$c"
  rm -rf "\$d"; mkdir -p "\$d/regs/identification"
  for sub in topology cache; do cp -r /sys/devices/system/cpu/cpu\$c/\$sub "\$d/" 2>/dev/null || true; done
  echo 0x00000000413fd0c1 > "\$d/regs/identification/midr_el1"
  echo 0x0 > "\$d/regs/identification/revidr_el1"
  mount --bind "\$d" /sys/devices/system/cpu/cpu\$c
done
mount --bind "$WORK/fake/cpuinfo" /proc/cpuinfo
exec "\$@"
INNER

for arch in neoverse-n1 armv8-a; do
  echo "replaying them on the aarch64 build ($arch) under qemu (a Neoverse-N1, 2 threads)"
  QEMU_CPU=neoverse-n1 QEMU_LD_PREFIX=/usr/aarch64-linux-gnu LD_LIBRARY_PATH="$TL:$WORK/stubs" OMP_NUM_THREADS=2 \
    unshare -m sh "$WORK/fake/enter.sh" qemu-aarch64-static "$WORK/obj/$arch/replay" "$WORK/calls"
done
