"""``metronome demo``: the WebRTC voice demo on 127.0.0.1:8080 (``--console`` for the console demo)."""

from __future__ import annotations

import argparse
import asyncio
import ipaddress
import os
import sys

from ._base import Command
from ._serving import serve_until, stop_on_signals

TOKEN_ENV = "METRONOME_TOKEN"


def _add(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8080, help="port to listen on (default 8080)")
    p.add_argument("--max-peers", type=int, default=8, help="peers connected at once (default 8)")
    p.add_argument("--window", type=int, default=256, help="tokens each session keeps (default 256)")
    p.add_argument("--sinks", type=int, default=4, help="first tokens each session pins (default 4)")
    p.add_argument(
        "--voice-objective",
        type=_objective,
        default=argparse.SUPPRESS,
        metavar="SECONDS",
        help="admit a caller only while every caller's first reply audio can start within SECONDS of the end "
        "of its speech (p95; default 1.5; a lone caller is always served; 'none': the engine's admission alone)",
    )
    p.add_argument(
        "--early-transcribe",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="transcribe what the caller said so far at each short pause (default on)",
    )
    p.add_argument(
        "--answer-ahead",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="start the answer at that pause, held until the turn ends, taken back if the caller goes on "
        "(default on; needs --early-transcribe)",
    )
    p.add_argument(
        "--history",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="let the model see the call's earlier turns (default off: each question is answered as the call's "
        "first; the bundled model repeats earlier answers when it sees them)",
    )
    p.add_argument(
        "--smart-turn",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="end a turn at a short pause when smart-turn v3 hears the caller finished (with the words model on, "
        "both must say so; default off)",
    )
    p.add_argument(
        "--text-turn",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="end a turn at a short pause when its transcript reads as finished (TextTurn; with --smart-turn, "
        "both must say so; default on; needs --early-transcribe)",
    )
    p.add_argument(
        "--end-silence",
        type=float,
        default=argparse.SUPPRESS,
        metavar="SECONDS",
        help="seconds of quiet that end a turn no turn model ended (default 0.55 with Silero VAD)",
    )
    p.add_argument(
        "--pause",
        type=float,
        default=argparse.SUPPRESS,
        help="seconds of pause after which the agent transcribes ahead and asks the turn models (default 0.1)",
    )
    p.add_argument(
        "--transcribe-pause",
        type=float,
        default=argparse.SUPPRESS,
        metavar="SECONDS",
        help="seconds of pause after which the transcription starts, when sooner than --pause (the turn "
        "still ends no sooner than --pause; default 0.05)",
    )
    p.add_argument(
        "--whisper-window",
        type=_window,
        default=argparse.SUPPRESS,
        metavar="SECONDS",
        help="seconds of audio Whisper's encoder reads for a short utterance (default 10; 30: Whisper's full window)",
    )
    p.add_argument(
        "--whisper-workers",
        type=_workers,
        default=argparse.SUPPRESS,
        metavar="N",
        help="callers' utterances Whisper hears at once (default 2)",
    )
    p.add_argument(
        "--reply-lead",
        type=_lead,
        default=argparse.SUPPRESS,
        metavar="SECONDS",
        help="seconds each reply's audio starts ahead of the wall clock, so a receiver's playout buffer "
        "(aiortc holds 80 ms) hands it on at once (default 0.08; 0: paced from its first frame)",
    )
    p.add_argument(
        "--decode-tokens",
        type=int,
        default=argparse.SUPPRESS,
        metavar="N",
        help="tokens each output frame of a caller's session may carry, where the tick has room (default 4)",
    )
    p.add_argument(
        "--first-words",
        type=_first_words,
        default=argparse.SUPPRESS,
        metavar="N",
        help="the reply's first part goes to the voice after N whole words when no comma or sentence end came "
        "sooner (default 6; 'none': it waits for one)",
    )
    p.add_argument(
        "--engine-threads",
        type=_threads,
        default=None,
        metavar="N",
        help="cores the engine's steps run on (default: all but one, which the voice models keep; "
        "'all': torch's default, every core)",
    )
    p.add_argument("--console", action="store_true", help="run the console demo instead (no browser)")
    p.add_argument("--sessions", type=int, default=3, help="console demo: concurrent sessions (default 3)")
    p.add_argument("--tokens", type=int, default=48, help="console demo: tokens each answer may take (default 48)")
    p.epilog = f"Set ${TOKEN_ENV} to require 'Authorization: Bearer <token>' on POST /offer."


def _objective(text: str) -> float | None:
    if text.strip().lower() == "none":
        return None
    try:
        seconds = float(text)
    except ValueError:
        seconds = float("nan")
    if not 0 < seconds < float("inf"):
        raise argparse.ArgumentTypeError(f"--voice-objective takes seconds > 0 or 'none', got {text!r}")
    return seconds


def _first_words(text: str) -> int | None:
    from ..voice._agent import check_first_words

    if text.strip().lower() == "none":
        return None
    try:
        if not text.strip().isdigit():
            raise ValueError(text)
        return check_first_words(int(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--first-words takes a count >= 1 or 'none', got {text!r}") from None


def _threads(text: str) -> int | str:
    if text.strip().lower() == "all":
        return "all"
    if not text.strip().isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"--engine-threads takes a count >= 1 or 'all', got {text!r}")
    return int(text)


def _workers(text: str) -> int:
    from ..voice._whisper import check_workers

    try:
        return check_workers(int(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--whisper-workers takes a count >= 1, got {text!r}") from None


def _window(text: str) -> float:
    from ..voice._whisper import FULL_WINDOW, check_window

    try:
        return check_window(float(text))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--whisper-window takes seconds in [1, {FULL_WINDOW:g}], got {text!r}"
        ) from None


def _lead(text: str) -> float:
    from ..webrtc._tracks import check_lead

    try:
        return check_lead(float(text))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--reply-lead takes seconds in [0, 1], got {text!r}") from None


def _run(args: argparse.Namespace) -> int:
    if args.console:
        from ..console_demo import run_console_demo

        return run_console_demo(sessions=args.sessions, max_tokens=args.tokens, window=args.window, sinks=args.sinks)
    return asyncio.run(_serve(args))


def _loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


async def _serve(args: argparse.Namespace) -> int:
    from ..webrtc import ServerConfig, WebRTCServer, demo_engine, voice_threads

    token = os.environ.get(TOKEN_ENV) or None
    optional = (
        "voice_objective",
        "decode_tokens",
        "first_words",
        "whisper_window",
        "whisper_workers",
        "pause",
        "transcribe_pause",
        "end_silence",
        "reply_lead",
    )
    given = {name: getattr(args, name) for name in optional if hasattr(args, name)}
    config = ServerConfig(
        host=args.host,
        port=args.port,
        token=token,
        max_peers=args.max_peers,
        early_transcribe=args.early_transcribe,
        answer_ahead=args.answer_ahead,
        smart_turn=args.smart_turn,
        text_turn=args.text_turn,
        history=args.history,
        **given,
    )
    if not _loopback(args.host) and token is None:
        print(f"warning: serving on {args.host} with no token; anyone who reaches it may talk", file=sys.stderr)
    print("loading the model and the voice ...", file=sys.stderr, flush=True)
    ready = "voice demo on {url}  (open it in a browser; Ctrl-C stops)"
    with stop_on_signals() as stop:
        threads = voice_threads() if args.engine_threads is None else args.engine_threads
        engine = demo_engine(window=args.window, sinks=args.sinks, threads=None if threads == "all" else threads)
        async with engine:
            server = WebRTCServer(engine, config)
            await serve_until(stop, server, f"{args.host}:{args.port}", ready)
    print("stopped: every peer connection and session closed", file=sys.stderr)
    return 0


DEMO = Command(
    None, "demo", "serve the WebRTC voice demo (speech in, the model's answer out) on 127.0.0.1:8080", _add, _run
)
