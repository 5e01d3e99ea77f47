"""Record op calls of the x86-64 generic build, for replay.cpp to check an aarch64 build against.

    python scripts/aarch64_emulated/record_ops.py DIR      (run.sh calls it)

The generic build runs the kernels' plain paths (no intrinsics), the ones an aarch64 build
compiles, and its tests hold it to torch. Recorded: every op call of a tiny engine's
scripted steps (the full and a window policy; at most 40 each), and direct calls of
group_linear, greedy_rows, silu_mul and rms_norm at shapes the engine's steps do not reach.
``DIR/manifest.txt`` lists per call its arguments as they were before it, its outputs, and
the arguments it wrote into as they were after; each tensor's bytes are a file beside it.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import torch

_ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(_ROOT / "tests"), str(_ROOT / "engine_backend")]

from engine.test_tiles import random_blocks  # type: ignore[import-not-found]  # noqa: E402
from engine.tiny import scripted_logits, tiny_hf, tiny_runner  # type: ignore[import-not-found]  # noqa: E402
from metronome_engine import EngineCore, KVPolicy  # noqa: E402
from metronome_engine.kernels import get_build  # noqa: E402
from metronome_engine.quant import pack_groups  # noqa: E402

_DTYPES = {
    torch.float32: "f32",
    torch.float16: "f16",
    torch.int64: "i64",
    torch.int32: "i32",
    torch.uint8: "u8",
    torch.int8: "i8",
    torch.bool: "b8",
}


class Manifest:
    def __init__(self, folder: Path) -> None:
        self.folder, self.files = folder, 0
        self.lines: list[str] = []
        folder.mkdir(parents=True, exist_ok=True)

    def tensor(self, t: torch.Tensor) -> str:
        self.files += 1
        name = f"t{self.files}.bin"
        (self.folder / name).write_bytes(t.contiguous().view(-1).view(torch.uint8).numpy().tobytes())
        return f"T {_DTYPES[t.dtype]} {t.dim()} {' '.join(map(str, t.shape))} {name}"

    def value(self, v: Any) -> None:
        if v is None:
            self.lines.append("N")
        elif isinstance(v, torch.Tensor):
            self.lines.append(self.tensor(v))
        elif isinstance(v, bool):
            self.lines.append(f"B {int(v)}")
        elif isinstance(v, int):
            self.lines.append(f"I {v}")
        elif isinstance(v, float):
            self.lines.append(f"F {v!r}")
        elif isinstance(v, list) and all(isinstance(x, torch.Tensor) for x in v):
            self.lines.append(f"L {len(v)}")
            self.lines += [self.tensor(x) for x in v]
        else:
            raise TypeError(f"cannot record a {type(v).__name__}")


class Recorder:
    """A build's ops whose calls (up to ``limit``) go into ``manifest``."""

    def __init__(self, ops: Any, manifest: Manifest, limit: int) -> None:
        self._ops, self._manifest, self._limit, self.calls = ops, manifest, limit, 0

    def __getattr__(self, name: str) -> Any:
        fn = getattr(self._ops, name)

        def call(*args: Any) -> Any:
            before = [a.clone() if isinstance(a, torch.Tensor) else a for a in args]
            before = [[x.clone() for x in a] if isinstance(a, list) else a for a in before]
            result = fn(*args)
            if self.calls < self._limit and name != "tiles_ready":
                self.calls += 1
                m = self._manifest
                m.lines.append(f"CALL {name} {len(args)}")
                for a in before:
                    m.value(a)
                outs = list(result) if isinstance(result, tuple) else [result]
                m.lines.append(f"OUT {len(outs)}")
                for o in outs:
                    m.value(o)
                written = [
                    i
                    for i, (a, b) in enumerate(zip(args, before, strict=True))
                    if isinstance(a, torch.Tensor) and not torch.equal(a, b)
                ]
                m.lines.append(f"MUT {len(written)}")
                for i in written:
                    m.lines.append(f"ARG {i}")
                    m.value(args[i])
            return result

        return call


def main() -> None:
    manifest = Manifest(Path(sys.argv[1]))
    build = get_build("generic")
    build.load()
    torch.manual_seed(0)
    for policy in (KVPolicy.full(), KVPolicy.windowed(6, sinks=2)):
        model = tiny_runner(tiny_hf(0))
        engine = EngineCore(model, policy=policy, num_blocks=64, block_size=4, kernels="fused", isa="generic")
        engine.ops = Recorder(engine.ops, manifest, 40)
        scripted_logits(engine)
    ops = Recorder(build.ops, manifest, 1000)
    for q4 in (True, False):
        for n, k in ((64, 64), (42, 96), (48, 1536)):
            groups = pack_groups(random_blocks(n, k, q4=q4))
            for rows in (1, 2, 3, 4, 9, 33):
                ops.group_linear(torch.randn(rows, k), groups, n, torch.randn(rows, n) if rows % 2 else None)
    logits = torch.randn(6, 1007)  # a vocabulary that leaves a tail
    logits[3, 5] = float("nan")
    logits[2, 10] = logits[2, 900] = 60.0  # a tie: the first
    ops.greedy_rows(logits)
    gate = torch.tensor([[-200.0, -90.0, -87.5, 0.0, 88.5, 200.0, float("nan"), 3.0] * 4])
    ops.silu_mul(torch.cat([gate, torch.linspace(-2, 2, 32)[None]], dim=1))
    ops.silu_mul(torch.randn(5, 80) * 6)
    ops.rms_norm(torch.randn(7, 96) * 3, torch.randn(96), 1e-5)
    (manifest.folder / "manifest.txt").write_text("\n".join(manifest.lines) + "\n")
    calls = sum(1 for line in manifest.lines if line.startswith("CALL "))
    print(f"recorded {calls} op calls of the generic build in {manifest.folder}")


if __name__ == "__main__":
    main()
