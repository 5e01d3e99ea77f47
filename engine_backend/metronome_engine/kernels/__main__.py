"""``python -m metronome_engine.kernels``: build the fused CPU kernels now."""

from . import build_dir, load

load()
print(f"fused CPU kernels ready in {build_dir()}")
