"""``python -m metronome_engine.kernels [ISA ...]``: build the fused CPU kernels now
(default: every build this machine can run: native and generic, and on x86-64 x86-64-v3)."""

import sys

from . import get_build, runnable_isas

wanted = sys.argv[1:] or runnable_isas()
for isa in wanted:
    build = get_build(isa)  # type: ignore[arg-type]
    build.load()
    print(f"fused CPU kernels ({isa}) ready in {build.build_dir()}")
