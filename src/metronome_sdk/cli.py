"""The ``metronome`` command line. Each command prints a table, or JSON with ``--json``."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ._extras import MissingExtra
from .commands import COMMANDS

__all__ = ["main", "build_parser"]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="metronome", description=__doc__)
    groups = parser.add_subparsers(dest="group", required=True, metavar="COMMAND")
    group_parsers: dict[str, argparse._SubParsersAction[argparse.ArgumentParser]] = {}
    for command in COMMANDS:
        if command.group is None:
            sub = groups.add_parser(command.name, help=command.help, description=command.help)
        else:
            if command.group not in group_parsers:
                gp = groups.add_parser(command.group, help=f"{command.group} commands")
                group_parsers[command.group] = gp.add_subparsers(dest="command", required=True, metavar="COMMAND")
            sub = group_parsers[command.group].add_parser(command.name, help=command.help, description=command.help)
        command.add_arguments(sub)
        sub.set_defaults(run=command.run)
    return parser


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
