"""Run pytest once more for every kernel build this machine can run beside native.

``make test`` runs the whole suite on the native build, then this: the engine's tests again
under each other build (``generic``; on x86-64 ``x86-64-v3``, and ``x86-64-v4`` where the
CPU has AVX-512), each in its own process with ``METRONOME_KERNELS_ISA`` set and torch, MKL
and oneDNN held to the build's vector unit (``kernels.held_env``), so that the process runs
what a machine of that kind runs. A build that does not compile here fails its run: these
builds must compile on every machine that can run them.

    python tests/run_each_build.py [PYTEST ARGS ...]    (default: tests/engine)
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

from metronome_engine import cpu
from metronome_engine.kernels import ISA_ENV, held_env, runnable_isas


def main(argv: list[str]) -> int:
    args = argv or ["tests/engine"]
    builds = [isa for isa in runnable_isas() if isa != "native"]
    flags = ", ".join(name for name, has in cpu.vector_flags().items() if has) or "none of them"
    print(f"== the other kernel builds on {cpu.model_name()} ({flags}): {', '.join(builds) or 'none'}", flush=True)
    failed: list[str] = []
    for isa in builds:
        env = {**os.environ, **held_env(isa), ISA_ENV: isa}
        said = " ".join(f"{k}={v}" for k, v in {**held_env(isa), ISA_ENV: isa}.items())
        print(f"== {said} pytest {' '.join(args)}", flush=True)
        start = time.monotonic()
        rc = subprocess.call([sys.executable, "-m", "pytest", *args], env=env)
        print(f"== {isa}: exit {rc} in {time.monotonic() - start:.0f} s", flush=True)
        if rc != 0:
            failed.append(f"{isa} (exit {rc})")
    if failed:
        print(f"== failed on: {', '.join(failed)}", flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
