"""The signaling server's settings: where it listens, what it accepts, what its agent says."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from ..voice._admission import DEFAULT_OBJECTIVE
from ..voice._agent import TRANSCRIBE_PAUSE, check_first_words, check_transcribe_pause
from ..voice._whisper import DEFAULT_WINDOW, SERVER_WORKERS, check_window, check_workers
from ._tracks import check_lead

__all__: list[str] = []  # internal: ServerConfig and DEFAULT_PROMPT, exported by metronome_sdk.webrtc

# chosen by `metronome eval answers` (docs/voice-agent.md): the most answers right and all in English;
# "You are a friendly voice assistant. Answer in one or two short sentences." answered France's capital in French
DEFAULT_PROMPT = "Answer the question in one short English sentence. Be factual and direct."
# aiortc's audio receiver holds four 20 ms packets back before the first: a reply that starts this far
# ahead of the wall clock is handed on as soon as it arrives (ReplyAudioTrack(lead=...))
REPLY_LEAD = 0.08
AHEAD_TOKENS = 96  # a spoken question and its first clause, with room: what an answer ahead may take back


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerConfig:
    """Where and how the signaling server listens, and what it accepts.

    It binds ``127.0.0.1`` unless told otherwise. ``token``: when set, ``POST /offer``
    needs ``Authorization: Bearer <token>`` (compared in constant time). ``max_body``
    caps a request body (bytes; an SDP offer is a few KiB); ``max_peers`` caps the peers
    connected at once, whatever admission would allow; ``busy_retry_after`` is the
    ``Retry-After`` sent when that cap is hit. ``media_timeout``: a peer that sends no
    audio for that long has vanished, and its session is closed. ``max_buffered``: a peer
    that leaves more than that many bytes of events unread is shed (``SessionBroken``,
    ``reason="slow_consumer"``). ``offers_per_client`` offers per ``offer_window`` seconds
    are taken from one client address (every ``POST /offer`` counts, refused or not, so a
    token cannot be guessed quickly); more get 429 with ``Retry-After``.
    ``allow_origins``: the web origins (``"https://app.example"``) whose pages may call
    the server cross-origin; none by default, so browsers refuse cross-origin calls.
    ``max_reply_tokens`` bounds each answer of the default voice agent; ``decode_tokens`` is
    how many tokens each of its sessions' output frames may carry (``Session.decode_tokens``):
    4 by default, so a first sentence of 12 tokens can be whole in three ticks, not twelve,
    where the tick's token budget has room (the engine decides, and AIMD sees the cost).
    ``first_words``: the reply's first part goes to the voice after that many whole words when no
    comma or sentence end came sooner (``VoiceAgent(first_words=...)``: 6; ``None``: it waits for one).
    ``early_transcribe`` (on): the agent transcribes what the caller said so far at each short
    pause, so a turn that ends there has its transcript (nearly) ready (``VoiceAgent``); ``answer_ahead``
    (on; needs ``early_transcribe``): the agent also starts the answer then, held back until the
    turn ends and taken back exactly if the caller goes on (each session is opened with
    ``rewind_tokens=AHEAD_TOKENS``, 96, which widens its bound by 7 blocks of 16; measured in
    docs/voice-agent.md: the slowest turns, those the silence ends, wait least); ``pause``: the
    seconds of quiet after which they start (``VoiceAgent(pause=...)``; 0.1 here, where the words
    model decides at it); ``transcribe_pause``: the quiet after which the transcription starts,
    when sooner than ``pause`` (``VoiceAgent(transcribe_pause=...)``: 0.05; the turn still ends no
    sooner than ``pause``); ``text_turn`` (on, with ``early_transcribe``): ``TextTurn`` ends the turn at
    such a pause when its transcript reads as finished, else the silence does (measured in
    docs/voice-agent.md: the median caller waits less, a few more half-sentences are answered);
    ``smart_turn``: smart-turn v3 (``SmartTurn``) must also hear the caller finished (alone, when
    ``text_turn`` is off). ``end_silence``: the seconds of quiet that end a turn no model ended
    (``default_turn_detector``: 0.55 with Silero VAD); 1.0 halves the half-sentences answered
    with the words model on, at the cost of the turns it misreads.
    ``whisper_window``: the seconds of audio the default voice's Whisper reads for a short
    utterance (``WhisperSTT(window=...)``: 10; 30 is Whisper's full window); ``whisper_workers``:
    how many callers' utterances it hears at once (``WhisperSTT(workers=...)``: 2, so two callers
    who stop together are heard side by side; the engine is idle while its callers speak).
    ``voice_objective``: the default voice agent's callers are admitted only while each can
    still hear its first reply audio within that many seconds of the end of its speech (p95,
    ``VoiceAdmission``: 1.5 s, the upper end of what local CPU pipelines reach; the server's clock
    plus ``WEBRTC_UNSEEN``, what it cannot see of the caller's wait); a lone
    caller is always served; ``None`` admits on the engine's admission alone.
    ``reply_lead``: each caller's reply audio starts that many seconds ahead of the wall clock
    (``ReplyAudioTrack(lead=...)``: 0.08, what aiortc's receiver holds back; 0: paced from its first frame).
    ``history`` (off): whether the model sees the call's earlier turns (``VoiceAgent(history=...)``);
    off, each turn is taken back once answered and every question is heard as the call's first
    (the session is opened with ``rewind_tokens=AHEAD_TOKENS``): with the bundled SmolLM2-135M a
    call's later answers repeat its earlier ones when it sees them (docs/voice-agent.md, "Answers").
    """

    host: str = "127.0.0.1"
    port: int = 8080
    token: str | None = field(default=None, repr=False)
    max_peers: int = 8
    max_body: int = 64 << 10
    busy_retry_after: float = 5.0
    media_timeout: float = 10.0
    max_buffered: int = 256 << 10
    offers_per_client: int = 20
    offer_window: float = 60.0
    allow_origins: tuple[str, ...] = ()
    system_prompt: str | None = DEFAULT_PROMPT
    max_reply_tokens: int = 48
    decode_tokens: int = 4
    first_words: int | None = 6
    early_transcribe: bool = True
    answer_ahead: bool = True
    pause: float = 0.1
    transcribe_pause: float | None = TRANSCRIBE_PAUSE
    smart_turn: bool = False
    text_turn: bool = True
    end_silence: float | None = None
    whisper_window: float = DEFAULT_WINDOW
    whisper_workers: int = SERVER_WORKERS
    demo_page: bool = True
    reply_lead: float = REPLY_LEAD
    voice_objective: float | None = DEFAULT_OBJECTIVE
    history: bool = False

    @property
    def rewind_tokens(self) -> int:
        """What each caller's session may take back (``Session(rewind_tokens=...)``): 0 unless answering
        ahead or taking each turn back (``history`` off)."""
        return AHEAD_TOKENS if (self.early_transcribe and self.answer_ahead) or not self.history else 0

    @property
    def reads_words(self) -> bool:
        """Whether the default agent asks the words model: it reads the transcript of each pause, so only
        with ``early_transcribe``."""
        return self.text_turn and self.early_transcribe

    def agent_options(self) -> dict[str, Any]:
        """The default voice agent's settings from this config (``VoiceAgent``'s keyword arguments)."""
        return {
            "max_reply_tokens": self.max_reply_tokens,
            "decode_tokens": self.decode_tokens,
            "first_words": self.first_words,
            "early_transcribe": self.early_transcribe,
            "answer_ahead": self.answer_ahead,
            "pause": self.pause,
            "transcribe_pause": self.transcribe_pause,
            "history": self.history,
        }

    def __post_init__(self) -> None:
        if isinstance(self.port, bool) or not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            raise ValueError(f"port must be an int in [0, 65535], got {self.port!r}; 0 picks a free port")
        if self.token is not None and (not isinstance(self.token, str) or len(self.token) < 8):
            raise ValueError("token must be a str of at least 8 characters (or None for no token)")
        if isinstance(self.max_peers, bool) or not isinstance(self.max_peers, int) or self.max_peers < 1:
            raise ValueError(f"max_peers must be an int >= 1, got {self.max_peers!r}; try 8")
        if isinstance(self.max_body, bool) or not isinstance(self.max_body, int) or self.max_body < 1024:
            raise ValueError(f"max_body must be an int >= 1024 bytes, got {self.max_body!r}; try 65536")
        if isinstance(self.pause, bool) or not isinstance(self.pause, int | float) or not 0 < self.pause <= 2:
            raise ValueError(f"pause must be in (0, 2] seconds, got {self.pause!r}; try 0.2")
        check_lead(self.reply_lead, "reply_lead")
        check_transcribe_pause(self.transcribe_pause)
        for name in ("early_transcribe", "answer_ahead", "smart_turn", "text_turn", "history"):
            if not isinstance(getattr(self, name), bool):
                raise ValueError(f"{name} must be True or False, got {getattr(self, name)!r}")
        if self.end_silence is not None and (
            isinstance(self.end_silence, bool)
            or not isinstance(self.end_silence, int | float)
            or not 0 < self.end_silence <= 10
        ):
            raise ValueError(
                f"end_silence must be in (0, 10] seconds, or None for the detector's; got {self.end_silence!r}"
            )
        if isinstance(self.decode_tokens, bool) or not isinstance(self.decode_tokens, int) or self.decode_tokens < 1:
            raise ValueError(f"decode_tokens must be an int >= 1, got {self.decode_tokens!r}; try 4")
        check_first_words(self.first_words)
        check_window(self.whisper_window)
        check_workers(self.whisper_workers)
        for name in ("max_buffered", "offers_per_client"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        if not isinstance(self.allow_origins, tuple) or not all(
            isinstance(o, str) and o.startswith(("http://", "https://")) and o.count("/") == 2
            for o in self.allow_origins
        ):
            raise ValueError(
                f"allow_origins must be a tuple of origins like 'https://app.example' (no '*', no path), "
                f"got {self.allow_origins!r}"
            )
        objective = self.voice_objective
        if objective is not None and (
            isinstance(objective, bool) or not isinstance(objective, int | float) or not 0 < objective < math.inf
        ):
            raise ValueError(f"voice_objective must be a number of seconds > 0, or None; got {objective!r}; try 1.5")
        for name in ("busy_retry_after", "media_timeout", "offer_window"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value < math.inf:
                raise ValueError(f"{name} must be a finite number > 0 (seconds), got {value!r}")

    def __repr__(self) -> str:
        token = "set" if self.token else "none"
        return (
            f"ServerConfig(host={self.host!r}, port={self.port}, token={token}, max_peers={self.max_peers}, "
            f"max_body={self.max_body}, offers_per_client={self.offers_per_client}/{self.offer_window:g}s, "
            f"allow_origins={self.allow_origins!r})"
        )
