"""Input encoding: the tokens an input frame appends, checked before it is queued.

Checked here, one frame at a time, so one bad frame cannot break a step that other
sessions share: text goes through the tokenizer's chat template, audio through the
engine's codec, token frames are checked against the model's vocabulary.
"""

from __future__ import annotations

from .._codec import FrameCodec, TextTokenizer, chat_turn
from .._exceptions import InputQueueFull
from .._frames import InputFrame
from .channel import QueuedFrame
from .state import SessionState

__all__: list[str] = []  # internal: InputEncoder


class InputEncoder:
    def __init__(self, tokenizer: TextTokenizer | None, codec: FrameCodec | None, vocab_size: int) -> None:
        self.tokenizer = tokenizer
        self.codec = codec
        self.vocab_size = vocab_size

    def require_tokenizer(self, what: str) -> TextTokenizer:
        if self.tokenizer is None:
            raise ValueError(f"{what} needs a tokenizer; pass tokenizer= to Engine, or send token or audio frames")
        return self.tokenizer

    def system(self, prompt: str) -> list[int]:
        """The system prompt's tokens: always the first turn, so it carries the template's preamble."""
        tok = self.require_tokenizer("a system prompt")
        return chat_turn(tok, "system", prompt, first=True, generation_prompt=False)

    def frame(self, frame: InputFrame, *, rendered: bool) -> list[int]:
        """The tokens ``frame`` appends; ``rendered``: the session's chat preamble was already sent."""
        if frame.text:
            tok = self.require_tokenizer("a text frame")
            ids = chat_turn(tok, "user", frame.text, first=not rendered, generation_prompt=True)
            source = "the tokenizer"
        elif frame.audio is not None:
            assert frame.sample_rate is not None
            if self.codec is None:
                raise ValueError(
                    "an audio frame needs a codec to become tokens, and this engine has none: pass codec= to "
                    "Engine (a FrameCodec; metronome.FixedRateCodec() carries audio's load, not its meaning), "
                    "or send text (the voice path transcribes speech) or token frames; nothing was queued"
                )
            source = f"the codec {self.codec!r}"
            try:
                ids = list(self.codec.encode(frame.samples_float32(), frame.sample_rate))
            except Exception as exc:  # a custom codec's bug must not escape as anything but bad input
                raise ValueError(f"audio: {source} could not encode the frame ({exc!r}); nothing was queued") from exc
        elif frame.tokens is not None:
            ids = list(frame.tokens)
            source = "the frame"
        else:
            ids = []
            source = "the frame"
        vocab = self.vocab_size
        for t in ids:
            if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab:
                field = "tokens holds" if frame.tokens is not None else f"{source} produced token"
                raise ValueError(f"{field} {t!r}, outside the model's vocabulary [0, {vocab}); nothing was queued")
        return ids

    def queue(self, slot: SessionState, frame: InputFrame, *, submitted: float, retry_after: float) -> QueuedFrame:
        """Encode ``frame`` and put it in the session's input queue; ``InputQueueFull`` when it is full."""
        channel = slot.channel
        if not channel.has_input_room():
            # refused before anything changes: the accepted frames keep their place and answers
            raise InputQueueFull(
                f"session {slot.session_id} has {channel.input_queue} frames waiting (ReliabilityConfig.input_queue): "
                "it sends faster than the engine ticks, one frame per session per tick; read outputs as they come "
                "and send again after retry_after",
                retry_after=retry_after,
                session_id=slot.session_id,
            )
        first_turn = not slot.rendered and bool(frame.text)
        tokens = self.frame(frame, rendered=slot.rendered)
        carried = len(slot.with_next_frame)
        if not tokens and not carried and channel.counts.sent == 0:
            raise ValueError(
                "the first frame of a session must carry input (text, audio or tokens) or follow a system prompt"
            )
        tokens = slot.take_with_next_frame(text=bool(frame.text)) + tokens
        pending = QueuedFrame(frame, tokens, submitted, channel.counts.sent, carried=carried, first_turn=first_turn)
        channel.put_input(pending)
        return pending

    def turn_ahead(self, slot: SessionState, text: str) -> int:
        """Queue the user's turn ``text`` as context before the session's next frame; its tokens.

        All but its last token go to the tick loop's prefill (appended in ticks with no output,
        ``tick.py``); the last goes with the next frame, so an empty frame answers the turn.
        """
        channel = slot.channel
        if channel.inputs:
            raise ValueError(
                f"session {slot.session_id} has {len(channel.inputs)} frames queued: a turn given with append() "
                "goes in before the next frame, so read the queued frames' outputs first; nothing was queued"
            )
        tokens = self.frame(InputFrame.from_text(text), rendered=slot.rendered)
        if not tokens:
            raise ValueError("append() needs text that is not empty; nothing was queued")
        slot.queue_turn(tokens)
        channel.reply = []  # new input: the next outputs are a new reply (what interrupt() keeps)
        return len(tokens)
