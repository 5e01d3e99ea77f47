"""``metronome serve``: OpenAI-compatible chat completions and Realtime on the embedded engine (127.0.0.1:8000)."""

from __future__ import annotations

import argparse
import asyncio
import sys

from ._base import Command
from ._serving import serve_until, stop_on_signals
from .demo import TOKEN_ENV, _loopback


def _add(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    p.add_argument("--port", type=int, default=8000, help="port to listen on (default 8000; 0 picks a free one)")
    p.add_argument("--window", type=int, default=256, help="tokens each session keeps (default 256)")
    p.add_argument("--sinks", type=int, default=4, help="first tokens each session pins (default 4)")
    p.add_argument("--max-tokens", type=int, default=128, help="reply length when a request names none (default 128)")
    p.add_argument(
        "--idle-timeout", type=float, default=120.0, help="seconds before an idle named session closes (default 120)"
    )
    p.add_argument("--memory-mib", type=int, default=256, help="the KV block pool in MiB (default 256)")
    p.add_argument(
        "--replica-id",
        default=None,
        help="this server's name as one replica of many: an X-Metronome-Replica header and a replica metric label",
    )
    p.add_argument("--max-sessions", type=int, default=None, help="admit at most this many sessions at once")
    p.add_argument(
        "--min-sessions", type=int, default=None, help="never let the latency-driven cap fall below this many"
    )
    p.add_argument(
        "--no-realtime",
        action="store_true",
        help="serve chat completions only: no /v1/realtime, and no speech models loaded",
    )
    p.epilog = f"Set ${TOKEN_ENV} to require 'Authorization: Bearer <token>' (the OpenAI client's api_key)."


def _run(args: argparse.Namespace) -> int:
    return asyncio.run(_serve(args))


async def _serve(args: argparse.Namespace) -> int:
    import importlib.util
    import os

    from .. import AdmissionConfig, Engine, EngineConfig, TimingConfig
    from ..serve import ChatServer, RealtimeConfig, ServeConfig

    token = os.environ.get(TOKEN_ENV) or None
    realtime = None if args.no_realtime else RealtimeConfig()
    if realtime is not None and importlib.util.find_spec("faster_whisper") is None:
        print("note: no /v1/realtime: it needs the [voice] extra (pip install 'metronome-sdk[voice]')", file=sys.stderr)
        realtime = None
    config = ServeConfig(
        host=args.host,
        port=args.port,
        token=token,
        max_tokens=args.max_tokens,
        idle_timeout=args.idle_timeout,
        replica_id=args.replica_id,
        realtime=realtime,
    )
    for flag, value in (("--max-sessions", args.max_sessions), ("--min-sessions", args.min_sessions)):
        if value is not None and value < 1:
            raise ValueError(f"{flag} must be >= 1, got {value}")
    if args.max_sessions is not None and args.min_sessions is not None and args.min_sessions > args.max_sessions:
        raise ValueError(f"--min-sessions {args.min_sessions} exceeds --max-sessions {args.max_sessions}")
    caps = {"max_limit": args.max_sessions, "min_limit": args.min_sessions}
    admission = AdmissionConfig(**{k: v for k, v in caps.items() if v is not None})
    if args.memory_mib < 1:
        raise ValueError(f"--memory-mib must be >= 1, got {args.memory_mib}")
    engine_config = EngineConfig(kv="window", window=args.window, sinks=args.sinks, memory_bytes=args.memory_mib << 20)
    if not _loopback(args.host) and token is None:
        print(f"warning: serving on {args.host} with no token; anyone who reaches it may use it", file=sys.stderr)
    print("loading the model" + (" and the voice" if realtime else "") + " ...", file=sys.stderr, flush=True)
    # short prefill chunks, so that a long prompt never holds the metronome for long on a CPU
    timing = TimingConfig(period=0.08, max_chunk_tokens=16)
    with stop_on_signals() as stop:
        async with Engine(engine_config, timing=timing, admission=admission) as engine:
            server = ChatServer(engine, config)
            await serve_until(
                stop, server, f"{args.host}:{args.port}", "serving {url}  (OpenAI base_url; Ctrl-C stops)"
            )
    print("stopped: every reply interrupted and every session closed", file=sys.stderr)
    return 0


SERVE = Command(
    None,
    "serve",
    "serve OpenAI-compatible /v1/chat/completions and /v1/realtime on the embedded engine (127.0.0.1:8000)",
    _add,
    _run,
)
