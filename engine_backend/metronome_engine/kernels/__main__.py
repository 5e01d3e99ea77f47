"""``python -m metronome_engine.kernels [ISA ...]``: build the fused CPU kernels now
(default: the native build and, on x86-64, the x86-64-v3 one)."""

import platform
import sys

from . import ISAS, get_build

wanted = sys.argv[1:] or [isa for isa in ISAS if isa == "native" or platform.machine() in ("x86_64", "AMD64")]
for isa in wanted:
    build = get_build(isa)  # type: ignore[arg-type]
    build.load()
    print(f"fused CPU kernels ({isa}) ready in {build.build_dir()}")
