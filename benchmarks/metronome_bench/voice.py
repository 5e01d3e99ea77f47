"""Voice to voice as a caller hears it: aiortc callers talk to the demo's WebRTC server in real time.

Each caller is a real aiortc peer: its microphone track plays a spoken question in real time
(20 ms frames, paced on the wall clock, then silence), and it times on its own clock, from
the moment its track handed over the question's last speech frame to the first reply frame
it receives whose RMS is above ``LOUD`` (0.02 of full scale). The receiving side is stock
aiortc, playout buffer included, as a client would run it. The server's own breakdown of
each turn (its ``latency`` event) and its transcripts come beside it on the data channel.
Needs the ``[webrtc]`` extra (``metronome bench voice`` checks for it before it imports this).
Nothing is mocked: the questions are spoken at run time (by Piper's joe voice and
espeak-ng), and the server is ``metronome demo``'s.

Why this module is past 400 lines: the caller (its microphone, its peer, the turn loop that
times it) and what it reports (turns, refusals, the round's summary) are one measurement;
``spawn_demo`` starts the server it measures.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import re
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path
from typing import Any

import aiohttp
import av
import numpy as np
import numpy.typing as npt
from aiortc import MediaStreamTrack, RTCPeerConnection, RTCSessionDescription
from aiortc.mediastreams import MediaStreamError

__all__ = [
    "LOUD",
    "Refused",
    "SpokenQuestion",
    "TurnResult",
    "call",
    "last_speech_frame",
    "machine",
    "nearest_rank",
    "rms",
    "run_round",
    "rtvi_stages",
    "rtvi_text",
    "spawn_anchor",
    "spawn_demo",
    "summarize",
    "to_caller_rate",
]

RATE = 48000  # what a WebRTC microphone sends (Opus runs at 48 kHz)
FRAME = 960  # 20 ms
LOUD = 0.02  # RMS of full scale: a frame above it is speech, below it silence or comfort noise
QUIET_AFTER = 0.6  # seconds of reply below LOUD after its final transcript: the reply has played out


def rms(pcm: npt.NDArray[np.int16]) -> float:
    """Root mean square of int16 samples, as a share of full scale (0 to 1)."""
    if pcm.size == 0:
        return 0.0
    x = pcm.astype(np.float64) / 32768.0
    return float(np.sqrt(np.mean(x * x)))


def to_caller_rate(pcm: npt.NDArray[np.int16], rate: int) -> npt.NDArray[np.int16]:
    """Speech at ``rate`` as 48 kHz int16 (linear interpolation: the question goes up in rate, never down)."""
    pcm = np.asarray(pcm, dtype=np.int16).reshape(-1)
    if rate == RATE or pcm.size == 0:
        return pcm.copy()
    n = round(pcm.size * RATE / rate)
    x = np.arange(n) * (rate / RATE)
    out: npt.NDArray[np.int16] = np.interp(x, np.arange(pcm.size), pcm.astype(np.float64)).round().astype(np.int16)
    return out


def last_speech_frame(pcm: npt.NDArray[np.int16], frame: int = FRAME, level: float = LOUD) -> int:
    """Index of the last ``frame``-sample frame of ``pcm`` whose RMS is above ``level``; -1 if none is."""
    last = -1
    for i in range(0, pcm.size, frame):
        if rms(pcm[i : i + frame]) > level:
            last = i // frame
    return last


def nearest_rank(values: Sequence[float], p: float) -> float | None:
    """The ``p``-th percentile (0-100) by nearest rank: a value that was measured, even from few samples."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(p / 100 * len(ordered)) - 1)]


@dataclass(frozen=True, slots=True)
class SpokenQuestion:
    """A question as a caller says it: the text, the voice that spoke it, and the 48 kHz samples."""

    text: str
    voice: str
    pcm: npt.NDArray[np.int16] = field(repr=False)

    def __post_init__(self) -> None:
        if last_speech_frame(self.pcm) < 0:
            raise ValueError(f"{self.voice} said nothing above RMS {LOUD} for {self.text!r}")


@dataclass(frozen=True, slots=True)
class TurnResult:
    """One question and its answer, as one caller heard it.

    ``voice_to_voice``: seconds on the caller's clock from its last speech frame to the first
    reply frame above ``LOUD`` (``None``: no reply came within the turn's timeout). ``heard``
    and ``answer`` are the server's final transcripts of the turn; ``server`` its ``latency``
    event (the stages, in seconds) when it sent one, and ``ahead`` whether that event says the
    turn was answered ahead (``None``: no event). ``frames``: the tokens each reply frame carried,
    in order (``Session.decode_tokens`` asks for several; the tick grants what its budget has room for);
    ``late``: how many of them missed the engine's frame deadline.
    """

    callers: int
    caller: int
    question: str
    voice: str
    voice_to_voice: float | None
    heard: str
    answer: str
    server: dict[str, float] | None
    ahead: bool | None = None
    frames: tuple[int, ...] = ()
    late: int = 0

    def as_dict(self) -> dict[str, Any]:
        return {
            "callers": self.callers,
            "caller": self.caller,
            "question": self.question,
            "voice": self.voice,
            "voice_to_voice": self.voice_to_voice,
            "heard": self.heard,
            "answer": self.answer,
            "server": self.server,
            "ahead": self.ahead,
            "frames": list(self.frames),
            "late": self.late,
        }


class Refused(RuntimeError):
    """The server refused a call with a retryable status (429 or 503): who, why, and how fast."""

    def __init__(self, status: int, error: str, retry_after: float | None, seconds: float) -> None:
        super().__init__(f"the server refused the call: {status} {error} (Retry-After {retry_after})")
        self.status = status
        self.error = error
        self.retry_after = retry_after
        self.seconds = seconds  # from sending the offer to the refusal

    def as_dict(self, *, callers: int, caller: int) -> dict[str, Any]:
        return {
            "callers": callers,
            "caller": caller,
            "status": self.status,
            "error": self.error,
            "retry_after": self.retry_after,
            "seconds": round(self.seconds, 4),
        }


class _Microphone(MediaStreamTrack):  # type: ignore[misc]  # aiortc is untyped
    """Silence, and each question said once, in 20 ms frames paced on the wall clock."""

    kind = "audio"

    def __init__(self) -> None:
        super().__init__()
        self._speech = np.zeros(0, dtype=np.int16)
        self._pos = 0  # samples handed over so far
        self._start: float | None = None
        self._last_at: tuple[int, asyncio.Future[float]] | None = None

    def say(self, pcm: npt.NDArray[np.int16]) -> asyncio.Future[float]:
        """Speak ``pcm`` from the next frame on; resolves to when its last speech frame went out."""
        begin = -(-self._pos // FRAME) * FRAME  # the next whole frame
        self._speech = np.concatenate([np.zeros(begin, dtype=np.int16), pcm])
        done: asyncio.Future[float] = asyncio.get_running_loop().create_future()
        self._last_at = (begin + last_speech_frame(pcm) * FRAME, done)
        return done

    async def recv(self) -> av.AudioFrame:
        if self.readyState != "live":
            raise MediaStreamError
        if self._start is None:
            self._start = time.monotonic()
        wait = self._start + self._pos / RATE - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)
        chunk = np.zeros(FRAME, dtype=np.int16)
        part = self._speech[self._pos : self._pos + FRAME]
        chunk[: part.size] = part
        frame = av.AudioFrame.from_ndarray(chunk.reshape(1, -1), format="s16", layout="mono")
        frame.sample_rate, frame.pts, frame.time_base = RATE, self._pos, Fraction(1, RATE)
        if self._last_at is not None and self._pos >= self._last_at[0]:
            _, done = self._last_at
            self._last_at = None
            if not done.done():
                done.set_result(time.monotonic())
        self._pos += FRAME
        return frame


class _Caller:
    """One aiortc peer: a microphone, the reply track's loud frames, the data channel's events."""

    def __init__(self) -> None:
        self.pc = RTCPeerConnection()
        self.microphone = _Microphone()
        self.pc.addTrack(self.microphone)
        self.channel = self.pc.createDataChannel("events")
        self.channel.on("message", self._on_message)
        self.events: list[dict[str, Any]] = []
        self.received: list[float] = []  # time.monotonic() when each event came
        self.loud: list[float] = []  # time.monotonic() of each reply frame above LOUD
        self.frames_in = 0  # reply-track frames received: the other side's audio flows
        self.changed = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self.pc.on("track", self._on_track)

    def _on_message(self, message: str | bytes) -> None:
        with contextlib.suppress(ValueError):
            event = json.loads(message)
            if isinstance(event, dict):
                self.events.append(event)
                self.received.append(time.monotonic())
                self.changed.set()

    def _on_track(self, track: Any) -> None:
        task = asyncio.ensure_future(self._listen(track))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _listen(self, track: Any) -> None:
        with contextlib.suppress(MediaStreamError):
            while True:
                frame = await track.recv()
                self.frames_in += 1
                if self.frames_in == 1:
                    self.changed.set()
                pcm = frame.to_ndarray().reshape(-1).astype(np.int16)
                if rms(pcm) > LOUD:
                    self.loud.append(time.monotonic())
                    self.changed.set()

    async def connect(self, url: str, token: str | None) -> None:
        await self.pc.setLocalDescription(await self.pc.createOffer())
        offer = {"sdp": self.pc.localDescription.sdp, "type": "offer"}
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        sent = time.monotonic()
        async with aiohttp.ClientSession() as http, http.post(url + "offer", json=offer, headers=headers) as resp:
            body = await resp.json()
            if resp.status in (429, 503):
                retry = resp.headers.get("Retry-After")
                error = str(body.get("error", "")) if isinstance(body, dict) else ""
                raise Refused(resp.status, error, float(retry) if retry else None, time.monotonic() - sent)
            if resp.status != 200:
                raise RuntimeError(f"the server refused the call: {resp.status} {body}")
        await self.pc.setRemoteDescription(RTCSessionDescription(sdp=body["sdp"], type=body["type"]))

    async def until(self, done: Callable[[], bool], timeout: float) -> bool:
        """Wait until ``done()`` holds; whether it did within ``timeout`` seconds."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                while not done():
                    self.changed.clear()
                    await self.changed.wait()
                return True
        return done()

    async def close(self) -> None:
        if self.channel.readyState == "open":
            self.channel.send(json.dumps({"type": "bye"}))
            await asyncio.sleep(0.05)
        await self.pc.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)


def _final(events: Sequence[dict[str, Any]], role: str) -> list[str]:
    return [
        str(e.get("text", ""))
        for e in events
        if e.get("type") == "transcript" and e.get("role") == role and e.get("final")
    ]


def _is(event: dict[str, Any], kind: str) -> bool:
    """Whether ``event`` is Pipecat's RTVI message ``kind`` (of a user's transcription, a final one)."""
    if event.get("label") != "rtvi-ai" or event.get("type") != kind:
        return False
    data = event.get("data")
    return kind != "user-transcription" or (isinstance(data, dict) and data.get("final") is True)


def rtvi_text(events: Sequence[dict[str, Any]], kind: str) -> list[str]:
    """The texts of Pipecat's RTVI messages of ``kind`` (``user-transcription`` final ones only)."""
    texts = []
    for e in events:
        data = e.get("data")
        if _is(e, kind) and isinstance(data, dict):
            texts.append(" ".join(str(data.get("text", "")).split()))
    return texts


def rtvi_stages(events: Sequence[dict[str, Any]], received: Sequence[float], spoken_at: float) -> dict[str, float]:
    """A Pipecat bot's turn in stages, from when its RTVI messages reached the caller (it sends no
    breakdown): its transcript, the turn's end, the first token, the first audio sent, each counted
    from the stage before it (the first from the caller's end of speech)."""
    marks = [("heard", "user-transcription"), ("turn_end", "user-stopped-speaking")]
    marks += [("first_token", "bot-llm-text"), ("first_audio_sent", "bot-started-speaking")]
    stages, last = {}, spoken_at
    for name, kind in marks:
        at = next((t for e, t in zip(events, received, strict=True) if _is(e, kind) and t > last), None)
        if at is None:
            break
        stages[name], last = at - last, at
    return stages


def _said(events: Sequence[dict[str, Any]], role: str, *, rtvi: bool) -> str:
    if rtvi:
        return " ".join(rtvi_text(events, "user-transcription" if role == "user" else "bot-transcription"))
    return " ".join(_final(events, role))


async def call(
    url: str,
    questions: Sequence[SpokenQuestion],
    *,
    callers: int,
    caller: int,
    token: str | None = None,
    delay: float = 0.0,
    timeout: float = 30.0,
    rtvi: bool = False,
) -> list[TurnResult]:
    """One call: ask each question in turn, each after the last reply has played out; one result each.

    ``rtvi``: the server is a Pipecat bot (the voice anchor), whose events are Pipecat's RTVI
    messages: it is ready once its audio flows, a reply is whole at ``bot-llm-stopped``, and it
    sends no breakdown of its own.
    """
    await asyncio.sleep(delay)
    peer = _Caller()
    results: list[TurnResult] = []
    try:
        await peer.connect(url, token)
        if rtvi:
            ready, what = (lambda: peer.frames_in > 0), "no audio"
        else:
            ready, what = (lambda: any(e.get("type") == "ready" for e in peer.events)), "no 'ready' event"
        if not await peer.until(ready, timeout):
            raise RuntimeError(f"caller {caller}: the server sent {what} within {timeout:g} s")
        for q in questions:
            seen = len(peer.events)
            spoken_at = await peer.microphone.say(q.pcm)

            def replied(spoken_at: float = spoken_at) -> bool:
                return bool(peer.loud) and peer.loud[-1] > spoken_at

            got = await peer.until(replied, timeout)
            first = next((t for t in peer.loud if t > spoken_at), None) if got else None

            def answered(seen: int = seen) -> bool:
                if rtvi:
                    return any(_is(e, "bot-llm-stopped") for e in peer.events[seen:])
                return bool(_final(peer.events[seen:], "assistant"))

            await peer.until(answered, timeout)
            # the reply plays out before the next question (a caller waits for the answer)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                quiet_since = peer.loud[-1] if peer.loud else spoken_at
                if time.monotonic() - quiet_since >= QUIET_AFTER:
                    break
                await asyncio.sleep(0.1)
            events = peer.events[seen:]
            latency = next((e for e in events if e.get("type") == "latency"), None)
            server, ahead = None, None
            if rtvi:
                server = rtvi_stages(events, peer.received[seen:], spoken_at)
            elif latency is not None:  # the stages in seconds; a flag is no stage
                server = {
                    k: float(v)
                    for k, v in latency.items()
                    if k != "type" and isinstance(v, int | float) and not isinstance(v, bool)
                }
                ahead = latency.get("ahead") is True
            results.append(
                TurnResult(
                    callers=callers,
                    caller=caller,
                    question=q.text,
                    voice=q.voice,
                    voice_to_voice=None if first is None else first - spoken_at,
                    heard=_said(events, "user", rtvi=rtvi),
                    answer=_said(events, "assistant", rtvi=rtvi),
                    server=server,
                    ahead=ahead,
                    frames=tuple(int(e.get("tokens", 0)) for e in events if e.get("type") == "frame"),
                    late=sum(e.get("deadline_missed") is True for e in events if e.get("type") == "frame"),
                )
            )
    finally:
        await peer.close()
    return results


async def run_round(
    url: str,
    questions: Sequence[SpokenQuestion],
    *,
    callers: int,
    turns: int,
    token: str | None = None,
    stagger: float = 0.5,
    timeout: float = 30.0,
    refused: list[dict[str, Any]] | None = None,
    rtvi: bool = False,
) -> list[TurnResult]:
    """``callers`` calls at once, each asking ``turns`` questions (caller ``i`` starts ``i * stagger`` s late).

    Caller ``i`` asks questions ``i, i + callers, i + 2 * callers ...`` (round the list), so that
    callers at once ask different questions, and in different voices when the list alternates them.
    A call the server refuses (429/503, ``Refused``) goes into ``refused`` when it is given (its
    status, error, Retry-After and how fast it came), and raises when it is not.
    """
    if callers < 1 or turns < 1:
        raise ValueError(f"callers and turns must be >= 1, got {callers} and {turns}")
    if not questions:
        raise ValueError("no questions to ask")
    plans = [[questions[(i + k * callers) % len(questions)] for k in range(turns)] for i in range(callers)]

    async def one(i: int, plan: list[SpokenQuestion]) -> list[TurnResult]:
        try:
            return await call(
                url, plan, callers=callers, caller=i, token=token, delay=i * stagger, timeout=timeout, rtvi=rtvi
            )
        except Refused as exc:
            if refused is None:
                raise
            refused.append(exc.as_dict(callers=callers, caller=i))
            return []

    # every call runs to its end before a failure is raised: none is left running behind it
    per_caller = await asyncio.gather(*(one(i, plan) for i, plan in enumerate(plans)), return_exceptions=True)
    for outcome in per_caller:
        if isinstance(outcome, BaseException):
            raise outcome
    return [r for results in per_caller if not isinstance(results, BaseException) for r in results]


def summarize(callers: int, results: Sequence[TurnResult], refused: Sequence[dict[str, Any]] = ()) -> dict[str, Any]:
    """p50 / p95 (nearest rank) of the admitted callers' voice to voice, the server's median of
    each stage, and the calls refused (with the slowest refusal's seconds)."""
    heard = [r.voice_to_voice for r in results if r.voice_to_voice is not None]
    stages: dict[str, list[float]] = {}
    for r in results:
        for name, value in (r.server or {}).items():
            if math.isfinite(value):
                stages.setdefault(name, []).append(value)
    return {
        "callers": callers,
        "admitted": callers - len(refused),
        "refused": list(refused),
        "refused_within_s": max((r["seconds"] for r in refused), default=None),
        "turns": len(results),
        "no_reply": sum(r.voice_to_voice is None for r in results),
        "answered_ahead": sum(r.ahead is True for r in results),
        "frames": sum(len(r.frames) for r in results),
        "late_frames": sum(r.late for r in results),
        "p50": nearest_rank(heard, 50),
        "p95": nearest_rank(heard, 95),
        "max": max(heard) if heard else None,
        "server_median": {name: float(np.median(v)) for name, v in stages.items()},
        "results": [r.as_dict() for r in results],
    }


def machine() -> dict[str, Any]:
    """The CPU as ``lscpu`` names it, the vector-unit flags that matter here, the load."""
    name, flags = "", set[str]()
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10, check=False).stdout
        for line in out.splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "Model name" and not name:
                name = value.strip()
            elif key.strip() == "Flags":
                flags = set(value.split())
    load = os.getloadavg() if hasattr(os, "getloadavg") else None
    return {
        "model_name": name or None,
        "cores": os.cpu_count(),
        "avx2": "avx2" in flags,
        "avx512f": "avx512f" in flags,
        "amx_tile": "amx_tile" in flags,
        "load_avg": None if load is None else [round(x, 2) for x in load],
    }


_READY = re.compile(r"voice demo on (http://\S+/)")
_ANCHOR_READY = re.compile(r"pipecat anchor on (http://\S+/)")


@contextlib.asynccontextmanager
async def spawn_demo(args: Sequence[str] = (), *, log: Path, timeout: float = 600.0) -> AsyncIterator[str]:
    """``metronome demo --port 0`` in its own process (this Python, this environment); yields its URL.

    Its log goes to ``log``. On exit it gets SIGINT (as Ctrl-C), and is killed if it has not
    stopped within 30 s.
    """
    command = [sys.executable, "-m", "metronome_sdk.cli", "demo", "--port", "0", *args]
    async with _spawn(command, _READY, "`metronome demo`", log=log, timeout=timeout) as url:
        yield url


@contextlib.asynccontextmanager
async def spawn_anchor(*, log: Path, timeout: float = 600.0) -> AsyncIterator[str]:
    """The Pipecat voice anchor (``metronome_bench.pipecat_anchor``) in its own process; yields its URL."""
    command = [sys.executable, "-m", "metronome_bench.pipecat_anchor", "--port", "0"]
    async with _spawn(command, _ANCHOR_READY, "the Pipecat anchor", log=log, timeout=timeout) as url:
        yield url


@contextlib.asynccontextmanager
async def _spawn(
    command: list[str], ready: re.Pattern[str], name: str, *, log: Path, timeout: float
) -> AsyncIterator[str]:
    with log.open("wb") as sink:
        proc = await asyncio.create_subprocess_exec(
            *command, stdout=asyncio.subprocess.PIPE, stderr=sink, env={**os.environ, "PYTHONUNBUFFERED": "1"}
        )
        try:
            assert proc.stdout is not None
            url = None
            async with asyncio.timeout(timeout):
                while url is None:
                    line = await proc.stdout.readline()
                    if not line:
                        raise RuntimeError(f"{name} exited ({await proc.wait()}); see {log}")
                    found = ready.search(line.decode(errors="replace"))
                    url = found.group(1) if found else None
            yield url
        finally:
            if proc.returncode is None:
                proc.send_signal(2)
                try:
                    async with asyncio.timeout(30):
                        await proc.wait()
                except TimeoutError:
                    proc.kill()
                    await proc.wait()
