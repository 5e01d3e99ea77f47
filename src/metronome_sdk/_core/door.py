"""Admission at the door: admit a session, wait for room, or refuse it.

The AIMD cap and the memory guard decide (``admission.py``); the door applies their answer
to a session that wants in: its state in the engine's admitted set, or ``AdmissionRejected``
with ``retry_after``. ``room()`` is fired whenever a place may have opened (a session closed,
the cap rose), so waiting sessions try again.
"""

from __future__ import annotations

import math
from typing import Any

import anyio

from .._exceptions import AdmissionRejected, CacheExhausted
from .._log import get_logger
from .admission import Admitter
from .channel import SessionChannel
from .counters import Counters
from .encoding import InputEncoder
from .link import SessionRequest
from .memory import ConversationMemory
from .signal import Signal
from .state import EngineState, SessionState

__all__: list[str] = []  # internal: AdmissionDoor


class AdmissionDoor:
    def __init__(
        self,
        shared: EngineState,
        admitter: Admitter,
        counters: Counters,
        encoder: InputEncoder,
        *,
        max_chunk: int,
        prompt_at_open: bool = False,
    ) -> None:
        self.shared = shared
        self.prompt_at_open = prompt_at_open
        self.max_chunk = max_chunk
        self.admitter = admitter
        self.counters = counters
        self.encoder = encoder
        self._room = Signal()
        self._log = get_logger()

    def room(self) -> None:
        """A place may have opened: sessions waiting at the door try again."""
        self._room.fire()

    async def wait(self, channel: SessionChannel, request: SessionRequest, timeout: float) -> SessionState:
        """Admit, waiting up to ``timeout`` seconds (real time) for room; else ``AdmissionRejected``."""
        if timeout < 0 or not math.isfinite(timeout):
            raise ValueError(f"timeout must be a finite number >= 0 (seconds), got {timeout!r}")
        with anyio.move_on_after(timeout):
            while (slot := self.try_admit(channel, request)) is None:
                await self._room.wait()
            return slot
        raise self.reject(channel.session_id)

    def admit_nowait(self, channel: SessionChannel, request: SessionRequest) -> SessionState:
        slot = self.try_admit(channel, request)
        if slot is None:
            raise self.reject(channel.session_id)
        return slot

    def try_admit(self, channel: SessionChannel, request: SessionRequest) -> SessionState | None:
        shared, admitter = self.shared, self.admitter
        system_prompt, log = request.system_prompt, request.log
        prefix = self.encoder.system(system_prompt) if system_prompt is not None else []
        memory, pinned_blocks = self._pin(channel.session_id, len(prefix), request.pin_system_prompt, log)
        hold_blocks = self._hold(channel.session_id, request.rewind_tokens, pinned_blocks)
        held = sum(s.pinned_blocks + s.hold_blocks for s in shared.sessions.values()) + pinned_blocks + hold_blocks
        free = shared.pool.num_blocks - shared.pool.used_blocks
        if not admitter.admits(len(shared.sessions), free_blocks=free, pinned_blocks=held):
            return None
        slot = SessionState(
            channel.session_id,
            channel,
            request.sampling,
            log,
            memory=memory,
            pinned_blocks=pinned_blocks,
            decode_tokens=request.decode_tokens,
            rewind_tokens=request.rewind_tokens,
            hold_blocks=hold_blocks,
        )
        if system_prompt is not None:
            # prompt_at_open: the tick loop prefills all but its last token, which goes with the first frame
            slot.queue_prompt(prefix, ahead=self.prompt_at_open)
        shared.sessions[slot.session_id] = slot
        self.counters.session_admitted(len(shared.sessions))
        log.info("admission.admitted", in_flight=len(shared.sessions), limit=admitter.limit)
        return slot

    def _pin(self, session_id: int, prompt_tokens: int, pin: bool, log: Any) -> tuple[ConversationMemory, int]:
        """The session's memory account, and the blocks its pinned prompt adds to its bound;
        ``CacheExhausted`` when the pool could never hold that bound."""
        core = self.shared.core
        pinned = prompt_tokens if pin and core.policy.bounded else 0
        memory = ConversationMemory(core.policy, prompt_tokens=prompt_tokens, pinned=pinned)
        session_blocks = self.shared.session_blocks
        if not pinned or session_blocks is None:
            return memory, 0
        if not core.pins_prefixes:  # the prompt slides with the window, and the session says so
            log.warning("session.prompt_not_pinned", backend=type(core).__name__, prompt_tokens=prompt_tokens)
            return ConversationMemory(core.policy, prompt_tokens=prompt_tokens), 0
        bound = core.session_bound_blocks(chunk=self.max_chunk, pinned=pinned)  # type: ignore[call-arg]
        assert bound is not None  # bounded policy
        pool = self.shared.pool.num_blocks
        if bound > pool:
            raise CacheExhausted(
                f"session {session_id} pins a {pinned}-token system prompt: its bound is {bound} blocks, more than "
                f"the pool's {pool}; shorten the prompt, pass pin_system_prompt=False, or grow the pool",
                session_id=session_id,
                needed_blocks=bound,
                pool_blocks=pool,
            )
        return memory, bound - session_blocks

    def _hold(self, session_id: int, rewind_tokens: int, pinned_blocks: int) -> int:
        """The blocks a mark's hold adds to the session's bound; ``ValueError`` where the backend cannot
        take tokens back, ``CacheExhausted`` where the pool could never hold the bound with them."""
        if rewind_tokens == 0:
            return 0
        core = self.shared.core
        if not getattr(core, "rewinds", False):
            raise ValueError(
                f"session {session_id} asks for rewind_tokens={rewind_tokens}, but this engine's backend "
                f"({type(core).__name__}) cannot take tokens back; open it with rewind_tokens=0"
            )
        session_blocks = self.shared.session_blocks
        if session_blocks is None:  # unbounded (kv="full"): a hold keeps nothing the session would not
            return 0
        hold_blocks: int = core.hold_blocks(rewind_tokens)  # type: ignore[attr-defined]
        bound, pool = session_blocks + pinned_blocks + hold_blocks, self.shared.pool.num_blocks
        if bound > pool:
            raise CacheExhausted(
                f"session {session_id} holds {rewind_tokens} tentative tokens: its bound is {bound} blocks, more "
                f"than the pool's {pool}; lower rewind_tokens or grow the pool",
                session_id=session_id,
                needed_blocks=bound,
                pool_blocks=pool,
            )
        return hold_blocks

    def reject(self, session_id: int) -> AdmissionRejected:
        admitter = self.admitter
        admitter.record_rejection()
        self.counters.session_rejected()
        limit, in_flight, retry_after = admitter.limit, len(self.shared.sessions), admitter.retry_after()
        self._log.warning(
            "admission.rejected", session_id=session_id, limit=limit, in_flight=in_flight, retry_after=retry_after
        )
        return AdmissionRejected(
            f"the engine is at its session cap ({in_flight} of {limit} open); retry after {retry_after:.2f} s",
            retry_after=retry_after,
            limit=limit,
            in_flight=in_flight,
            session_id=session_id,
        )
