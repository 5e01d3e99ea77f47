"""A console demo of the embedded engine: several sessions answer at once, one batched step a tick."""

from __future__ import annotations

import time

from metronome_engine import EngineCore, KVPolicy, StepRequest
from metronome_engine.tokenizer import Tokenizer
from metronome_engine.weights import DEFAULT_MODEL, load_model

QUESTIONS = (
    "What is the capital of France?",
    "Name three colors of the rainbow.",
    "Why is the sky blue? Answer in one sentence.",
    "What is 2 plus 2?",
    "Give me a word that rhymes with cat.",
    "What do bees make?",
)


def run_console_demo(*, sessions: int = 3, max_tokens: int = 48, window: int = 256, sinks: int = 4) -> int:
    if not 1 <= sessions <= len(QUESTIONS):
        raise ValueError(f"--sessions must be in [1, {len(QUESTIONS)}], got {sessions}")
    print(f"loading {DEFAULT_MODEL} ...", flush=True)
    tok = Tokenizer(DEFAULT_MODEL)
    policy = KVPolicy.windowed(window, sinks=sinks)
    engine = EngineCore(load_model(DEFAULT_MODEL), policy=policy, memory_bytes=256 << 20)
    print(
        f"policy {policy!r}, pool of {engine.pool.num_blocks} blocks, bound "
        f"{engine.session_bound_blocks()} blocks per session\n"
    )
    seqs = {engine.add_sequence(): q for q in QUESTIONS[:sessions]}
    pending = {s: tok.chat([{"role": "user", "content": q}]) for s, q in seqs.items()}
    answers: dict[int, list[int]] = {s: [] for s in seqs}
    tick = 0
    while pending:
        t = time.perf_counter()
        outs = engine.step([StepRequest(s, toks) for s, toks in pending.items()])
        ms = (time.perf_counter() - t) * 1e3
        stats = engine.pool_stats()
        for out in outs:
            if not out.ok or out.token is None:
                print(f"session {out.seq_id}: stalled ({out.stall})")
                pending.pop(out.seq_id)
                continue
            answers[out.seq_id].append(out.token)
            if out.token in tok.stop_ids or len(answers[out.seq_id]) >= max_tokens:
                pending.pop(out.seq_id)
            else:
                pending[out.seq_id] = [out.token]
        tick += 1
        if tick % 8 == 0 or not pending:
            print(
                f"tick {tick:3d}  batch {len(outs):2d}  step {ms:6.1f} ms  pool {stats.used_blocks}/"
                f"{stats.num_blocks} blocks ({stats.occupancy:.1%})",
                flush=True,
            )
    print()
    for s, q in seqs.items():
        print(f"[session {s}] user: {q}\n[session {s}] model: {tok.decode(answers[s]).strip()}\n")
        engine.free_sequence(s)
    print(f"all sessions closed; pool {engine.pool_stats().used_blocks} blocks in use")
    return 0
