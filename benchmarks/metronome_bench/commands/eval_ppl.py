"""``metronome eval ppl``: streaming perplexity of a text under a KV policy."""

from __future__ import annotations

import argparse
from pathlib import Path

from metronome_engine import KVPolicy
from metronome_sdk.cli import Command

from ._output import emit_json, print_table, progress_bar


def policy_from_args(kv: str, window: int, sinks: int) -> KVPolicy:
    if kv == "full":
        return KVPolicy.full()
    return KVPolicy.windowed(window, sinks=sinks)


def _add(p: argparse.ArgumentParser) -> None:
    p.add_argument("--text", type=Path, required=True, help="UTF-8 text file to score")
    p.add_argument("--kv", choices=("full", "window"), default="window", help="KV policy (default: window)")
    p.add_argument("--window", type=int, default=256, help="W: recent tokens kept (default 256)")
    p.add_argument("--sinks", type=int, default=4, help="S: first tokens pinned (default 4)")
    p.add_argument("--max-tokens", type=int, default=None, help="score at most this many tokens of the text")
    p.add_argument("--chunk", type=int, default=64, help="tokens per engine step (does not change the result)")
    p.add_argument("--slices", type=int, default=1, help="also report perplexity per slice of the stream")
    p.add_argument("--model", default="smollm2-135m-instruct", help="known model name, HF folder or .gguf file")
    p.add_argument("--quantize", choices=["q8_0", "q4_1"], default=None, help="quantize the weights on load (cached)")
    p.add_argument("--json", action="store_true", help="print JSON")


def _run(args: argparse.Namespace) -> int:
    from metronome_engine.tokenizer import Tokenizer
    from metronome_engine.weights import load_model

    from ..eval.perplexity import engine_for_stream, streaming_nll

    if not args.text.is_file():
        raise ValueError(f"--text {args.text} is not a readable file")
    if args.max_tokens is not None and args.max_tokens < 2:
        raise ValueError(f"--max-tokens must be >= 2, got {args.max_tokens}")
    policy = policy_from_args(args.kv, args.window, args.sinks)
    text = args.text.read_text(encoding="utf-8")
    tokens = Tokenizer(args.model).encode(text)
    if args.max_tokens is not None:
        tokens = tokens[: args.max_tokens]
    engine = engine_for_stream(load_model(args.model, quantize=args.quantize), policy, len(tokens), chunk=args.chunk)
    with progress_bar(len(tokens) - 1, f"ppl {policy!r}") as bar:
        result = streaming_nll(engine, tokens, chunk=args.chunk, progress=bar.update)
    report = {
        "ppl": result.ppl,
        "tokens": result.tokens,
        "kv": args.kv,
        "window": args.window if args.kv == "window" else None,
        "sinks": args.sinks if args.kv == "window" else 0,
        "text": str(args.text),
        "model": args.model,
        "quantize": args.quantize,
        "ppl_by_slice": result.ppl_by_slice(args.slices) if args.slices > 1 else [result.ppl],
    }
    if args.json:
        emit_json(report)
    else:
        print_table(["policy", "tokens", "ppl"], [[repr(policy), result.tokens, result.ppl]])
    return 0


EVAL_PPL = Command("eval", "ppl", "streaming perplexity of a text under a KV policy", _add, _run)
