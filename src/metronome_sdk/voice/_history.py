"""Each question on its own: the session goes back to its system prompt after every turn.

A small model answers a call's later questions worse with the call's earlier turns in view: it
repeats an earlier answer ("A spider's legs are..." to "What do bees make?") instead of reading
the new question (measured in docs/voice-agent.md, "Answers"). ``VoiceAgent(history=False)``
marks the session once, at its system prompt (``Session.mark``), and after each turn rewinds
there (``Session.rewind``): the model hears every question as the first of the call, and the
window holds the prompt and one turn. The mark lasts the whole call, within the
``rewind_tokens`` the session was opened with; a turn longer than that stays in the context
(logged), and later turns go back to the end of it.
"""

from __future__ import annotations

from .._exceptions import RewindUnavailable
from .._log import get_logger
from .._session import ContextMark, Session

__all__: list[str] = []  # internal: the VoiceAgent's


class PromptMark:
    """The mark every turn of a call starts from (its one writer: the agent's reply loop)."""

    def __init__(self, session: Session) -> None:
        if session.rewind_tokens < 1:
            raise ValueError(
                "history=False takes each turn back after it is answered: open the session with "
                "rewind_tokens (e.g. Session(rewind_tokens=96))"
            )
        self.session = session
        self.mark: ContextMark | None = None
        self.kept = 0  # turns too long to take back, left in the context
        self._log = get_logger(session_id=session.id)

    async def before(self) -> ContextMark | None:
        """The mark the coming turn goes back to: taken now if there is none (``None``: the session
        is not quiet yet, its prompt still going in, and this turn stays in the context)."""
        if self.mark is None:
            try:
                self.mark = await self.session.mark()
            except ValueError as exc:
                self._log.info("voice.history_unmarked", error=str(exc))
        return self.mark

    async def after(self) -> None:
        """The turn is answered (or cut): take the context back to the mark."""
        if self.mark is None or self.session.closed:
            return
        try:
            await self.session.rewind(self.mark)
        except RewindUnavailable as exc:  # the turn stays; the next one marks after it
            self.mark = None
            self.kept += 1
            self._log.warning("voice.history_kept", error=str(exc))
