"""Text to speech with espeak-ng (Debian's ``espeak-ng`` package): small, offline, robotic."""

from __future__ import annotations

import io
import shutil
import subprocess
import wave

import numpy as np
import numpy.typing as npt

__all__ = ["EspeakTTS"]


class EspeakTTS:
    """``TextToSpeech`` through the ``espeak-ng`` program (22050 Hz mono).

    The text goes to its standard input, never onto its command line, so no text can
    be read as an option. ``voice`` and ``speed`` (words per minute) are espeak-ng's
    ``-v`` and ``-s``.
    """

    def __init__(
        self, *, voice: str = "en-us", speed: int = 165, executable: str = "espeak-ng", timeout: float = 20.0
    ) -> None:
        path = shutil.which(executable)
        if path is None:
            raise FileNotFoundError(
                f"{executable!r} is not on PATH; install it (Debian: apt-get install espeak-ng) or pass executable="
            )
        if isinstance(speed, bool) or not isinstance(speed, int) or not 80 <= speed <= 450:
            raise ValueError(f"speed must be an int in [80, 450] words per minute, got {speed!r}; try 165")
        self.voice = voice
        self.speed = speed
        self.timeout = timeout
        self._path = path

    def synthesize(self, text: str) -> tuple[npt.NDArray[np.int16], int]:
        proc = subprocess.run(
            [self._path, "--stdout", "-v", self.voice, "-s", str(self.speed)],
            input=text.encode("utf-8"),
            capture_output=True,
            timeout=self.timeout,
            check=False,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"espeak-ng failed ({proc.returncode}): {proc.stderr.decode(errors='replace')[:200]}")
        with wave.open(io.BytesIO(proc.stdout)) as w:
            rate, width, channels = w.getframerate(), w.getsampwidth(), w.getnchannels()
            # espeak-ng streams: its header claims 2**31 frames, so read what is there
            data = w.readframes(w.getnframes())
        if width != 2 or channels != 1:
            raise RuntimeError(f"espeak-ng wrote {channels} channels of {8 * width}-bit audio; expected 16-bit mono")
        return np.frombuffer(data, dtype=np.int16).copy(), rate

    def __repr__(self) -> str:
        return f"EspeakTTS(voice={self.voice!r}, speed={self.speed})"
