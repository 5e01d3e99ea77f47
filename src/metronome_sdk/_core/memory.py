"""What a session's model still sees: its pinned prompt, and which turns are still whole.

Under a window policy the cache keeps a session's first tokens (the sinks, or the whole
system prompt when it is pinned) and its last ``W`` tokens; the conversation between
them is gone for the model, though the application still has it. This module keeps
the account: where each turn began in the session's token stream, how many tokens the
window has dropped, and whether the system prompt is still whole. Pure Python.

A *turn* starts with each frame that carries input (a text message, tokens, audio);
the empty frames that let the model go on speaking belong to the turn before them.
"""

from __future__ import annotations

from dataclasses import dataclass

from metronome_engine import KVPolicy

__all__: list[str] = []  # internal: SessionStats is the public face of this account


@dataclass(frozen=True, slots=True)
class Forgotten:
    """What one step's eviction took: tokens, whole turns, and the system prompt."""

    tokens: int  # conversation tokens that left the window in this step
    turns: int  # turns that stopped being fully resident in this step
    prompt: bool  # the system prompt stopped being fully resident in this step


class ConversationMemory:
    """The account of one session's stream under ``policy``.

    ``prompt_tokens`` is the system prompt's length (0 without one) and ``pinned`` the
    prefix the session pins (the prompt's length when it is pinned, else 0).
    """

    __slots__ = ("_policy", "_starts", "evicted_tokens", "num_tokens", "pinned", "prompt_tokens")

    def __init__(self, policy: KVPolicy, *, prompt_tokens: int = 0, pinned: int = 0) -> None:
        if pinned > prompt_tokens:
            raise ValueError(f"pinned={pinned} is longer than the system prompt ({prompt_tokens} tokens)")
        self._policy = policy
        self.prompt_tokens = prompt_tokens
        self.pinned = pinned
        self.num_tokens = 0
        self.evicted_tokens = 0
        self._starts: list[int] = []  # stream index where each turn began

    @property
    def kept_prefix(self) -> int:
        """First tokens that never leave the cache: the sinks, or the pinned prompt."""
        return self._policy.pinned_tokens(self.pinned)

    @property
    def first_visible(self) -> int:
        """Stream index of the window's first token (what the last token saw after the prefix)."""
        return self.kept_prefix + self.evicted_tokens

    @property
    def turns(self) -> int:
        return len(self._starts)

    @property
    def oldest_resident_turn(self) -> int | None:
        """Index of the oldest turn still wholly in the cache (turns count from 0); ``None``
        before the first turn, or when not even the latest turn fits in the window."""
        visible = self.first_visible
        for i, start in enumerate(self._starts):
            if start >= visible or self.evicted_tokens == 0:
                return i
        return None

    @property
    def prompt_resident(self) -> bool:
        """Whether the model still sees the whole system prompt."""
        return self.prompt_tokens <= self.kept_prefix or self.evicted_tokens == 0

    def turn_started(self, start: int) -> None:
        """A frame with input began at stream index ``start`` (the system prompt before it is no turn)."""
        self._starts.append(max(start, self.prompt_tokens))

    def update(self, num_tokens: int) -> Forgotten:
        """The stream is ``num_tokens`` long now: what the window dropped since the last call."""
        turn_before = self._resident_index()
        prompt_before = self.prompt_resident
        evicted = self._policy.evicted(num_tokens, pinned=self.pinned)
        dropped = evicted - self.evicted_tokens
        self.num_tokens, self.evicted_tokens = num_tokens, evicted
        return Forgotten(
            tokens=dropped,
            turns=self._resident_index() - turn_before,
            prompt=prompt_before and not self.prompt_resident,
        )

    def snapshot(self) -> tuple[int, int, int]:
        """The account now, for ``restore`` (the session goes back to here: ``Session.rewind``)."""
        return len(self._starts), self.num_tokens, self.evicted_tokens

    def restore(self, snapshot: tuple[int, int, int]) -> None:
        """Back to a ``snapshot``: the turns begun since it are gone, and what the window dropped since."""
        turns, self.num_tokens, self.evicted_tokens = snapshot
        del self._starts[turns:]

    def _resident_index(self) -> int:
        # turns before this index are no longer whole (all of them when none is)
        oldest = self.oldest_resident_turn
        return len(self._starts) if oldest is None else oldest

    def __repr__(self) -> str:
        return (
            f"ConversationMemory(tokens={self.num_tokens}, kept_prefix={self.kept_prefix}, "
            f"evicted={self.evicted_tokens}, turns={self.turns}, oldest_resident_turn={self.oldest_resident_turn})"
        )
