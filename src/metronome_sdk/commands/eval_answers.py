"""``metronome eval answers``: the share of short spoken-style questions answered right, in English, per prompt."""

from __future__ import annotations

import argparse

from ._base import Command, emit_json, print_table, progress_bar


def _add(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--prompt",
        action="append",
        default=None,
        metavar="TEXT",
        help="a system prompt to try (repeat it for several; 'none' for the model's own); default: the built-in set",
    )
    p.add_argument("--max-tokens", type=int, default=48, help="tokens each answer may take (default 48, the demo's)")
    p.add_argument("--questions", type=int, default=None, help="the first N questions (default all)")
    p.add_argument("--answers", action="store_true", help="print every answer, not only the scores")
    p.add_argument("--json", action="store_true", help="print JSON")


def _run(args: argparse.Namespace) -> int:
    import anyio

    from ..eval.answers import PROMPTS, ask
    from ..eval.questions import QUESTIONS

    if args.max_tokens < 1:
        raise ValueError(f"--max-tokens must be >= 1, got {args.max_tokens}")
    if args.questions is not None and not 1 <= args.questions <= len(QUESTIONS):
        raise ValueError(f"--questions must be in [1, {len(QUESTIONS)}], got {args.questions}")
    prompts = PROMPTS if args.prompt is None else tuple(None if p.lower() == "none" else p for p in args.prompt)
    questions = QUESTIONS if args.questions is None else QUESTIONS[: args.questions]
    with progress_bar(len(prompts) * len(questions), "questions answered") as bar:
        bar.unit = "answer"
        scores = anyio.run(lambda: ask(prompts, questions, max_tokens=args.max_tokens, on_answer=lambda: bar.update(1)))
    if args.json:
        emit_json({"max_tokens": args.max_tokens, "prompts": [s.as_dict() for s in scores]})
        return 0
    if args.answers:
        for s in scores:
            print(f"prompt: {_name(s.prompt)}")
            for a in s.answers:
                print(f"  {'right' if a.right else 'WRONG'}  {a.question}  ->  {a.answer}")
        print()
    print_table(
        ["system prompt", "right", "english", "mean tokens"],
        [[_name(s.prompt), f"{100 * s.right:.0f}%", f"{100 * s.english:.0f}%", s.mean_tokens] for s in scores],
    )
    print(f"{len(questions)} questions, greedy, at most {args.max_tokens} tokens each; right: a key word, in English")
    return 0


def _name(prompt: str | None) -> str:
    return "(the model's default)" if prompt is None else prompt


EVAL_ANSWERS = Command(
    "eval",
    "answers",
    "the share of short spoken questions answered right, in English, per system prompt",
    _add,
    _run,
)
