"""``metronome demo``: a few sessions talking at once on the embedded engine (console)."""

from __future__ import annotations

import argparse

from ._base import Command


def _add(p: argparse.ArgumentParser) -> None:
    p.add_argument("--sessions", type=int, default=3, help="concurrent sessions (default 3)")
    p.add_argument("--tokens", type=int, default=48, help="tokens each answer may take (default 48)")
    p.add_argument("--window", type=int, default=256)
    p.add_argument("--sinks", type=int, default=4)


def _run(args: argparse.Namespace) -> int:
    from ..console_demo import run_console_demo

    return run_console_demo(sessions=args.sessions, max_tokens=args.tokens, window=args.window, sinks=args.sinks)


DEMO = Command(None, "demo", "talk to the embedded engine: concurrent sessions, latency and pool occupancy", _add, _run)
