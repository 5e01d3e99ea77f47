"""``metronome eval memory``: what a session still knows after N turns, per KV policy, on the real model."""

from __future__ import annotations

import argparse

from metronome_sdk.cli import Command

from ._model import Loader, load_named
from ._output import emit_json, print_table, progress_bar

_DEFAULT_FILLERS = (0, 4, 8, 12)
_QUICK_FILLERS = (0, 6)


def _fillers(text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"--fillers takes comma-separated ints, got {text!r}") from None
    if not values or any(v < 0 for v in values):
        raise argparse.ArgumentTypeError(f"--fillers must be ints >= 0, got {text!r}")
    return values


def _add(p: argparse.ArgumentParser) -> None:
    p.add_argument("--quick", action="store_true", help="N = 0 and 6, one trial: a smoke test")
    p.add_argument(
        "--fillers", type=_fillers, default=None, help="N values: filler turns, comma-separated (default 0,4,8,12)"
    )
    p.add_argument("--trials", type=int, default=None, help="conversations per policy and N (default 4)")
    p.add_argument("--window", type=int, default=256, help="W: recent tokens kept (default 256)")
    p.add_argument("--sinks", type=int, default=4, help="S: first tokens kept (default 4)")
    p.add_argument("--seed", type=int, default=0, help="seed of the facts and orders drawn per trial (default 0)")
    p.add_argument(
        "--threads", type=int, default=None, help="torch threads (default torch's; 1 is faster on a busy machine)"
    )
    p.add_argument("--model", default="smollm2-135m-instruct", help="known model name or HF Llama folder")
    p.add_argument("--json", action="store_true", help="print JSON (with every answer)")


def run(args: argparse.Namespace, load: Loader = load_named) -> int:
    """``metronome eval memory`` on parsed ``args``, on the model ``load(args.model)`` gives (by default
    the weights and tokenizer ``--model`` names; a caller's own model with its own ``load``)."""
    from ..eval.memory import run_memory_eval

    fillers = args.fillers or (_QUICK_FILLERS if args.quick else _DEFAULT_FILLERS)
    trials = args.trials if args.trials is not None else (1 if args.quick else 4)
    if trials < 1:
        raise ValueError(f"--trials must be >= 1, got {trials}")
    if args.window < 1 or args.sinks < 0:
        raise ValueError(f"--window must be >= 1 and --sinks >= 0, got {args.window} and {args.sinks}")
    if args.threads is not None:
        if args.threads < 1:
            raise ValueError(f"--threads must be >= 1, got {args.threads}")
        import torch

        torch.set_num_threads(args.threads)
    model, tokenizer = load(args.model)
    with progress_bar(0, "eval memory") as bar:
        bar.unit = "step"
        report = run_memory_eval(
            model,
            tokenizer,
            fillers=fillers,
            trials=trials,
            window=args.window,
            sinks=args.sinks,
            seed=args.seed,
            progress=bar.update,
        )
    if args.json:
        emit_json(report.as_dict())
        return 0
    print(
        f"W={report.window}, {report.sinks} sinks; system prompt {report.system_tokens:.0f} tokens, one filler "
        f"exchange {report.filler_tokens:.0f} tokens; {report.trials} trials per cell (share +- standard error)"
    )
    rows = [
        [
            c.n_filler,
            f"{c.tokens_before_questions:.0f}",
            c.policy,
            f"{c.system_share:.2f} +- {c.system_stderr:.2f}",
            f"{c.turn1_share:.2f} +- {c.turn1_stderr:.2f}",
        ]
        for c in sorted(report.cells, key=lambda c: (c.n_filler, c.policy))
    ]
    print_table(["N", "tokens", "policy", "system facts", "turn-1 facts"], rows)
    for check in report.checks():
        print(
            f"N={check['n_filler']}: pinned >= window: {check['pinned_at_least_window']}; pinned - full = "
            f"{check['pinned_minus_full']:+.2f} (2 SE {check['noise_2se']:.2f}): "
            f"{'within' if check['pinned_within_noise_of_full'] else 'outside'} the noise"
        )
    return 0


EVAL_MEMORY = Command(
    "eval",
    "memory",
    "retention: facts recalled after N turns under full, window and window + pinned prompt",
    _add,
    run,
)
