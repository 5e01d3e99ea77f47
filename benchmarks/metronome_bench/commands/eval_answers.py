"""``metronome eval answers``: the share of short spoken-style questions answered right, in English, per prompt."""

from __future__ import annotations

import argparse

from metronome_sdk.cli import Command

from ._output import emit_json, print_table, progress_bar


def _add(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--prompt",
        action="append",
        default=None,
        metavar="TEXT",
        help="a system prompt to try (repeat it for several; 'none' for the model's own); default: the built-in set",
    )
    p.add_argument("--max-tokens", type=int, default=48, help="tokens each answer may take (default 48, the demo's)")
    p.add_argument("--questions", type=int, default=None, help="the first N questions of each set (default all)")
    p.add_argument(
        "--set",
        choices=("choose", "held-out", "both"),
        default="both",
        help="the questions a prompt is chosen on, the held-out ones never used to choose, or both, scored "
        "apart (default both)",
    )
    p.add_argument(
        "--turns",
        type=int,
        default=1,
        metavar="N",
        help="questions asked one after another in one session, as a caller asks them (default 1: each on its own)",
    )
    p.add_argument(
        "--history",
        action="store_true",
        help="with --turns: the model sees the call's earlier turns (default: each turn is taken back once "
        "answered, as the demo's agent does)",
    )
    p.add_argument("--answers", action="store_true", help="print every answer, not only the scores")
    p.add_argument("--json", action="store_true", help="print JSON")


def _run(args: argparse.Namespace) -> int:
    import anyio

    from ..eval.answers import PROMPTS, PromptScore, ask
    from ..eval.questions import HELD_OUT, QUESTIONS

    if args.max_tokens < 1:
        raise ValueError(f"--max-tokens must be >= 1, got {args.max_tokens}")
    if args.turns < 1:
        raise ValueError(f"--turns must be >= 1, got {args.turns}")
    most = min(len(QUESTIONS), len(HELD_OUT))
    if args.questions is not None and not 1 <= args.questions <= most:
        raise ValueError(f"--questions must be in [1, {most}], got {args.questions}")
    prompts = PROMPTS if args.prompt is None else tuple(None if p.lower() == "none" else p for p in args.prompt)
    sets = {"choose": QUESTIONS, "held-out": HELD_OUT}
    if args.set != "both":
        sets = {args.set: sets[args.set]}
    sets = {name: qs[: args.questions] for name, qs in sets.items()}
    questions = [q for qs in sets.values() for q in qs]
    with progress_bar(len(prompts) * len(questions), "questions answered") as bar:
        bar.unit = "answer"
        scores = anyio.run(
            lambda: ask(
                prompts,
                questions,
                max_tokens=args.max_tokens,
                turns=args.turns,
                history=args.history,
                on_answer=lambda: bar.update(1),
            )
        )
    texts = {name: {q.text for q in qs} for name, qs in sets.items()}
    by_set = {
        name: [PromptScore(s.prompt, tuple(a for a in s.answers if a.question in texts[name])) for s in scores]
        for name in sets
    }
    if args.json:
        emit_json(
            {
                "max_tokens": args.max_tokens,
                "turns": args.turns,
                "history": args.history,
                "sets": {name: len(qs) for name, qs in sets.items()},
                "prompts": [
                    {
                        **s.as_dict(),
                        "by_set": {
                            name: {k: v for k, v in by_set[name][i].as_dict().items() if k != "answers"}
                            for name in sets
                        },
                    }
                    for i, s in enumerate(scores)
                ],
            }
        )
        return 0
    if args.answers:
        for s in scores:
            print(f"prompt: {_name(s.prompt)}")
            for a in s.answers:
                print(f"  {'right' if a.right else 'WRONG'}  {a.question}  ->  {a.answer}")
        print()
    print_table(
        ["system prompt", *(f"right ({name})" for name in sets), "english", "echoed", "mean tokens"],
        [
            [
                _name(s.prompt),
                *(f"{100 * by_set[name][i].right:.0f}%" for name in sets),
                f"{100 * s.english:.0f}%",
                f"{100 * s.echoed:.0f}%",
                f"{s.mean_tokens:.1f}",
            ]
            for i, s in enumerate(scores)
        ],
    )
    counts = ", ".join(f"{len(qs)} {name}" for name, qs in sets.items())
    print(f"questions: {counts}; greedy, at most {args.max_tokens} tokens each; right: a key word, in English")
    if args.turns > 1:
        seen = "with the call's earlier turns in view" if args.history else "each turn taken back once answered"
        print(f"calls of {args.turns} questions in order, {seen}; echoed: an answer opening as an earlier one did")
    if "held-out" in sets:
        print("choose a prompt on 'choose'; 'held-out' was never used to choose: it is the forecast for new questions")
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
