"""Retention: what a session still knows after N turns, under each KV policy.

A scripted conversation: a system prompt with three facts (the assistant's name, the
caller's name, a password), a first user turn with two more (a colour, a dog's name),
then ``N`` filler exchanges (a user question and a fixed assistant answer, both
scripted, so every policy reads the same tokens), then one question per fact, in a
random order, each answered greedily by the model. An answer is right when it holds the
expected word. Facts, filler order and question order are drawn per trial from a seed;
the script was written once and not adjusted to the model.

Three policies on the same script: ``full`` (nothing leaves: what the model itself can
hold), ``window`` (the last W tokens and the sinks) and ``pinned`` (the same window, the
system prompt pinned as a session pins it). ``full`` against ``window`` is what the
cache drops; ``full`` against the script at N = 0 is what the model cannot do at all.
Every trial of every N runs as its own session, all of one policy in one engine, each
step batched over them.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from metronome_engine import EngineCore, KVPolicy, StepRequest
from metronome_engine.model import LlamaModel

from .generation import ChatTokenizer

__all__ = ["FACTS", "MemoryReport", "PolicyCell", "Script", "build_script", "run_memory_eval"]

_CHUNK = 128  # prefill tokens per session per step
_ANSWER_TOKENS = 16

ASSISTANT_NAMES = ("Zorblax", "Quillon", "Marvessa", "Tobrin", "Kestrel", "Ondine", "Bramwell", "Sefira")
CALLER_NAMES = ("Priya", "Tomasz", "Ines", "Kwame", "Aiko", "Rafael", "Greta", "Dmitri")
PASSWORDS = ("tangerine", "obsidian", "lighthouse", "walrus", "cinnamon", "harpoon", "velvet", "marigold")
COLOURS = ("green", "purple", "orange", "yellow", "turquoise", "crimson", "silver", "indigo")
DOG_NAMES = ("Biscuit", "Pepper", "Waffles", "Juniper", "Noodle", "Bramble", "Pickle", "Sprocket")

# (fact, where it was given, question, pool of values)
FACTS: tuple[tuple[str, str, str, tuple[str, ...]], ...] = (
    ("assistant_name", "system", "What is your name?", ASSISTANT_NAMES),
    ("caller_name", "system", "What is my name?", CALLER_NAMES),
    ("password", "system", "What is the secret password?", PASSWORDS),
    ("colour", "turn1", "What is my favourite colour?", COLOURS),
    ("dog_name", "turn1", "What is my dog called?", DOG_NAMES),
)

# filler exchanges: everyday questions with plain answers, none touching a fact above
FILLER: tuple[tuple[str, str], ...] = (
    (
        "How do I keep basil growing on a windowsill?",
        "Give it at least six hours of sun, water it when the top of the soil is dry, and pinch off the "
        "flower buds so the plant keeps making leaves.",
    ),
    (
        "What is a good way to learn a new language?",
        "Practise a little every day, listen to native speakers, and try to hold simple conversations early, "
        "even if you make mistakes.",
    ),
    (
        "Why does bread go stale?",
        "The starch in bread slowly recrystallises and the crumb loses moisture to the crust and the air, "
        "so it turns firm and dry.",
    ),
    (
        "How far away is the Moon?",
        "On average the Moon is about 384,000 kilometres from Earth, and light takes a little over one second "
        "to cross that distance.",
    ),
    (
        "Can you suggest a quick breakfast?",
        "Try oats with yoghurt and fruit, or scrambled eggs on toast; both take less than ten minutes to make.",
    ),
    (
        "How do bicycles stay upright?",
        "A moving bicycle is steered back under its rider: the geometry of the front fork and small steering "
        "corrections keep it balanced.",
    ),
    (
        "What should I pack for a day hike?",
        "Bring water, a snack, a map, sun cream, a light jacket and a charged phone, and tell someone where "
        "you are going.",
    ),
    (
        "Why is the sky blue?",
        "Air molecules scatter short blue wavelengths of sunlight much more than red ones, so blue light "
        "reaches your eyes from every direction.",
    ),
    (
        "How often should I water a cactus?",
        "In summer about once every two weeks, and in winter once a month or less; let the soil dry out "
        "completely in between.",
    ),
    (
        "What is a simple way to save money each month?",
        "Set up an automatic transfer to savings on payday and track your spending for a month to see where it goes.",
    ),
    (
        "How do I get better sleep?",
        "Keep a regular bedtime, avoid screens and caffeine late in the day, and keep your bedroom cool, "
        "dark and quiet.",
    ),
    (
        "What makes a good cup of tea?",
        "Use freshly boiled water, let black tea steep for three to five minutes, and add milk only after "
        "the tea has brewed.",
    ),
)


@dataclass(frozen=True, slots=True)
class Script:
    """One trial's conversation: the facts' values, the turns, and the questions in order."""

    system: str
    turn1: str
    turn1_reply: str
    fillers: tuple[tuple[str, str], ...]
    questions: tuple[tuple[str, str, str], ...]  # (fact, question, expected word)


def build_script(trial: int, n_filler: int, *, seed: int = 0) -> Script:
    """The script of one trial (its facts, filler order and question order drawn from the seed)."""
    if n_filler < 0:
        raise ValueError(f"n_filler must be >= 0, got {n_filler}")
    rng = random.Random(f"{seed}:{trial}")  # the same trial draws the same facts at every N
    value = {name: rng.choice(pool) for name, _, _, pool in FACTS}
    order = rng.sample(range(len(FILLER)), len(FILLER))
    fillers = tuple(FILLER[order[i % len(order)]] for i in range(n_filler))
    questions = [(name, q, value[name]) for name, _, q, _ in FACTS]
    rng.shuffle(questions)
    system = (
        f"Your name is {value['assistant_name']}. When asked your name, answer: My name is "
        f"{value['assistant_name']}. The caller's name is {value['caller_name']}. The secret password is "
        f"{value['password']}. Always answer in one sentence."
    )
    turn1 = (
        f"Please remember two things. My favourite colour is {value['colour']}. My dog is called {value['dog_name']}."
    )
    return Script(system, turn1, "I will remember that.", fillers, tuple(questions))


@dataclass(slots=True)
class _Conversation:
    """One session of the run: its script as token pieces, and its answers as they come."""

    seq: int
    script: Script
    n_filler: int
    trial: int
    pieces: list[tuple[list[int], str]]  # (tokens to feed, the fact whose question they end with)
    answers: dict[str, str] = field(default_factory=dict)
    feed: list[int] = field(default_factory=list)
    asking: str | None = None
    reply: list[int] = field(default_factory=list)
    carry: list[int] = field(default_factory=list)  # an answer cut at the token limit: its last token, unfed

    @property
    def done(self) -> bool:
        return not self.pieces and not self.feed and self.asking is None


def _pieces(tok: ChatTokenizer, script: Script) -> tuple[list[tuple[list[int], str]], int, int]:
    """The script as token pieces in ChatML (SmolLM2's template), each ending in a question;
    the system prompt's length; the tokens before the first question."""
    system = tok.chat([{"role": "system", "content": script.system}], add_generation_prompt=False)

    def turn(role: str, text: str) -> str:
        return f"<|im_start|>{role}\n{text}<|im_end|>\n"

    text = turn("user", script.turn1) + turn("assistant", script.turn1_reply)
    for user, reply in script.fillers:
        text += turn("user", user) + turn("assistant", reply)
    history = system + tok.encode(text)
    pieces: list[tuple[list[int], str]] = []
    for k, (fact, question, _) in enumerate(script.questions):
        # after an answer: close its turn (its stop token was sampled, not fed), then ask
        ask = ("" if k == 0 else "<|im_end|>\n") + turn("user", question) + "<|im_start|>assistant\n"
        pieces.append(((history if k == 0 else []) + tok.encode(ask), fact))
    return pieces, len(system), len(history)


@dataclass(frozen=True, slots=True)
class PolicyCell:
    """One policy at one N: the share of facts recalled, per source, over the trials."""

    policy: str
    n_filler: int
    trials: int
    tokens_before_questions: float  # mean tokens of the conversation when the questions begin
    system_share: float
    system_stderr: float
    turn1_share: float
    turn1_stderr: float
    system_trial_sd: float  # spread of the per-trial share over the trials
    turn1_trial_sd: float

    def as_dict(self) -> dict[str, object]:
        return {
            "policy": self.policy,
            "n_filler": self.n_filler,
            "trials": self.trials,
            "tokens_before_questions": self.tokens_before_questions,
            "system": {"share": self.system_share, "stderr": self.system_stderr, "trial_sd": self.system_trial_sd},
            "turn1": {"share": self.turn1_share, "stderr": self.turn1_stderr, "trial_sd": self.turn1_trial_sd},
        }


@dataclass(frozen=True, slots=True)
class MemoryReport:
    window: int
    sinks: int
    trials: int
    seed: int
    filler_tokens: float  # mean tokens of one filler exchange (user + assistant)
    system_tokens: float  # mean tokens of the system prompt
    cells: list[PolicyCell]
    answers: list[dict[str, object]]  # every answer, for inspection

    def cell(self, policy: str, n_filler: int) -> PolicyCell:
        return next(c for c in self.cells if c.policy == policy and c.n_filler == n_filler)

    def checks(self) -> list[dict[str, object]]:
        """Per N: pinned >= window on the system facts, and pinned within 2 standard errors of full."""
        out: list[dict[str, object]] = []
        for n in sorted({c.n_filler for c in self.cells}):
            full, window, pinned = (self.cell(p, n) for p in ("full", "window", "pinned"))
            noise = 2 * math.hypot(pinned.system_stderr, full.system_stderr)
            out.append(
                {
                    "n_filler": n,
                    "pinned_at_least_window": pinned.system_share >= window.system_share,
                    "pinned_minus_full": pinned.system_share - full.system_share,
                    "noise_2se": noise,
                    "pinned_within_noise_of_full": abs(pinned.system_share - full.system_share) <= noise,
                }
            )
        return out

    def as_dict(self) -> dict[str, object]:
        return {
            "window": self.window,
            "sinks": self.sinks,
            "trials": self.trials,
            "seed": self.seed,
            "filler_tokens": self.filler_tokens,
            "system_tokens": self.system_tokens,
            "cells": [c.as_dict() for c in self.cells],
            "checks": self.checks(),
            "answers": self.answers,
        }


POLICIES = ("full", "window", "pinned")


def run_memory_eval(
    model: LlamaModel,
    tokenizer: ChatTokenizer,
    *,
    fillers: Sequence[int],
    trials: int,
    window: int = 256,
    sinks: int = 4,
    seed: int = 0,
    progress: Callable[[int], None] | None = None,
) -> MemoryReport:
    """Play every trial at every N under each policy; greedy answers."""
    if trials < 1:
        raise ValueError(f"trials must be >= 1, got {trials}")
    if not fillers or any(n < 0 for n in fillers):
        raise ValueError(f"fillers must be a non-empty list of N >= 0, got {list(fillers)}")
    scripts = [(n, t, build_script(t, n, seed=seed)) for n in fillers for t in range(trials)]
    system_tokens, filler_tokens, before = _lengths(tokenizer, scripts)
    cells: list[PolicyCell] = []
    answers: list[dict[str, object]] = []
    for name in POLICIES:
        policy = KVPolicy.full() if name == "full" else KVPolicy.windowed(window, sinks=sinks)
        convs = _play(model, tokenizer, policy, scripts, pin=name == "pinned", progress=progress)
        for c in convs:
            for fact, _, expected in c.script.questions:
                answers.append(
                    {
                        "policy": name,
                        "n_filler": c.n_filler,
                        "trial": c.trial,
                        "fact": fact,
                        "expected": expected,
                        "answer": c.answers[fact],
                        "correct": expected.lower() in c.answers[fact].lower(),
                    }
                )
        for n in dict.fromkeys(fillers):
            picked = [a for a in answers if a["policy"] == name and a["n_filler"] == n]
            cells.append(_cell(name, n, trials, before[n], picked))
    return MemoryReport(window, sinks, trials, seed, filler_tokens, system_tokens, cells, answers)


def _lengths(tok: ChatTokenizer, scripts: list[tuple[int, int, Script]]) -> tuple[float, float, dict[int, float]]:
    """Mean tokens of the system prompt, of one filler exchange, and before the questions at each N."""
    system: list[int] = []
    before: dict[int, list[int]] = {}
    for n, _, script in scripts:
        _, sys_len, history = _pieces(tok, script)
        system.append(sys_len)
        before.setdefault(n, []).append(history)
    mean = {n: sum(v) / len(v) for n, v in before.items()}
    filler = [tok.encode(f"<|im_start|>user\n{u}<|im_end|>\n<|im_start|>assistant\n{a}<|im_end|>\n") for u, a in FILLER]
    return sum(system) / len(system), sum(len(f) for f in filler) / len(filler), mean


def _cell(policy: str, n: int, trials: int, before: float, answers: list[dict[str, object]]) -> PolicyCell:
    def stats(source: str) -> tuple[float, float, float]:
        names = {name for name, where, _, _ in FACTS if where == source}
        picked = [a for a in answers if a["fact"] in names]
        share = sum(bool(a["correct"]) for a in picked) / len(picked)
        stderr = math.sqrt(share * (1 - share) / len(picked))
        per_trial = [sum(bool(a["correct"]) for a in picked if a["trial"] == t) / len(names) for t in range(trials)]
        mean = sum(per_trial) / trials
        sd = math.sqrt(sum((x - mean) ** 2 for x in per_trial) / (trials - 1)) if trials > 1 else 0.0
        return share, stderr, sd

    s_share, s_se, s_sd = stats("system")
    t_share, t_se, t_sd = stats("turn1")
    return PolicyCell(policy, n, trials, before, s_share, s_se, t_share, t_se, s_sd, t_sd)


def _play(
    model: LlamaModel,
    tok: ChatTokenizer,
    policy: KVPolicy,
    scripts: list[tuple[int, int, Script]],
    *,
    pin: bool,
    progress: Callable[[int], None] | None,
) -> list[_Conversation]:
    """Every script as its own session of one engine; each step serves every session once."""
    planned = [(n, t, s, *_pieces(tok, s)[:2]) for n, t, s in scripts]
    bs = 16
    if policy.bounded:
        blocks = sum(policy.max_blocks(bs, chunk=_CHUNK, pinned=p if pin else 0) or 0 for *_, p in planned)
    else:
        # the longest a conversation gets: its pieces, and every answer at the token limit
        longest = [sum(len(x) for x, _ in pieces) + len(pieces) * (_ANSWER_TOKENS + 1) for *_, pieces, _ in planned]
        blocks = sum(math.ceil(n / bs) + 1 for n in longest)
    engine = EngineCore(model, policy=policy, num_blocks=blocks, block_size=bs)
    convs = [
        _Conversation(engine.add_sequence(pinned=p if pin else 0), s, n, t, list(pieces))
        for n, t, s, pieces, p in planned
    ]
    try:
        while not all(c.done for c in convs):
            active = [c for c in convs if not c.done]
            requests = [_next_request(c) for c in active]
            for c, req, out in zip(active, requests, engine.step(requests), strict=True):
                if not out.ok:
                    raise RuntimeError(f"the memory evaluation's engine stalled ({out.stall}); its pool is too small")
                if req.sample:
                    assert out.token is not None
                    _take(c, out.token, tok)
            if progress is not None:
                progress(1)
    finally:
        for c in convs:
            engine.free_sequence(c.seq)
    return convs


def _next_request(c: _Conversation) -> StepRequest:
    if c.asking is not None and not c.feed:  # decoding an answer: feed back its last token
        return StepRequest(c.seq, c.reply[-1:], sample=True)
    if not c.feed:
        tokens, fact = c.pieces.pop(0)
        c.feed, c.carry = c.carry + tokens, []  # an answer cut at the limit: its last token goes first
        c.asking = fact
    piece, c.feed = c.feed[:_CHUNK], c.feed[_CHUNK:]
    return StepRequest(c.seq, piece, sample=not c.feed and c.asking is not None)


def _take(c: _Conversation, token: int, tok: ChatTokenizer) -> None:
    c.reply.append(token)
    if token in tok.stop_ids or len(c.reply) >= _ANSWER_TOKENS:
        assert c.asking is not None
        c.answers[c.asking] = tok.decode(c.reply).strip()
        c.carry = [] if token in tok.stop_ids else [token]
        c.asking = None
        c.reply = []
