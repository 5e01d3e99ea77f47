"""The ``metronome`` command line. Each command prints a table, or JSON with ``--json``.

``demo`` and ``serve`` are the SDK's own. Other distributions add command groups through the
``metronome.commands`` entry point group: each entry names a sequence of :class:`Command`.
metronome-bench (``benchmarks/`` in the repository) brings ``metronome bench`` and
``metronome eval`` that way, so ``pip install metronome-sdk`` carries no benchmark code.
A command raises ``ValueError`` for bad input and :class:`MissingExtra` for an optional
package that is not installed (``require`` raises it, naming the extra): either prints one
line and exits 2.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Iterable, Sequence
from importlib.metadata import entry_points

from ._extras import MissingExtra, require
from .commands import COMMANDS, Command

__all__ = ["Command", "MissingExtra", "build_parser", "main", "require"]

_ENTRY_POINTS = "metronome.commands"
# command groups that live in another distribution, and what installs them
_ADDON_GROUPS = {"bench": "metronome-bench", "eval": "metronome-bench"}


def _addon_commands() -> tuple[list[Command], dict[str, str]]:
    """The commands other distributions bring, and for each entry that failed to load, why."""
    found: list[Command] = []
    broken: dict[str, str] = {}
    for entry in entry_points(group=_ENTRY_POINTS):
        try:
            found.extend(entry.load())
        except ImportError as exc:  # installed but not importable: said when its group is called
            broken[entry.name] = f"{type(exc).__name__}: {exc}"
    return found, broken


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="metronome",
        description="Real-time sessions over a bounded KV cache: the demo, the server, installed add-ons.",
    )
    groups = parser.add_subparsers(dest="group", required=True, metavar="COMMAND")
    addons, broken = _addon_commands()
    group_parsers: dict[str, argparse._SubParsersAction[argparse.ArgumentParser]] = {}
    for command in (*COMMANDS, *addons):
        if command.group is None:
            sub = groups.add_parser(command.name, help=command.help, description=command.help)
        else:
            if command.group not in group_parsers:
                gp = groups.add_parser(command.group, help=f"{command.group} commands")
                group_parsers[command.group] = gp.add_subparsers(dest="command", required=True, metavar="COMMAND")
            sub = group_parsers[command.group].add_parser(command.name, help=command.help, description=command.help)
        command.add_arguments(sub)
        sub.set_defaults(run=command.run)
    _add_missing_groups(groups, present=group_parsers, broken=broken.values())
    return parser


def _add_missing_groups(
    groups: argparse._SubParsersAction[argparse.ArgumentParser], *, present: Iterable[str], broken: Iterable[str]
) -> None:
    # `metronome bench ...` without metronome-bench: say what to install, not "invalid choice"
    why = "; ".join(broken)
    for group, distribution in _ADDON_GROUPS.items():
        if group in present:
            continue
        message = f"metronome {group} comes with the {distribution} package: pip install {distribution}"
        if why:
            message += f" (an installed entry point did not load: {why})"
        sub = groups.add_parser(group, help=f"{group} commands (needs {distribution})")
        sub.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
        sub.set_defaults(run=_missing(message))


def _missing(message: str) -> Callable[[argparse.Namespace], int]:
    def run(args: argparse.Namespace) -> int:
        raise MissingExtra(message)

    return run


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.run(args) or 0)
    except (ValueError, MissingExtra) as exc:  # bad input or an extra not installed: one clear line, no traceback
        print(f"metronome: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    raise SystemExit(main())
