"""A voice callers share puts each reply's first part ahead of later parts waiting for it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import numpy as np
import numpy.typing as npt
import pytest

from metronome_sdk import Engine
from metronome_sdk.transports import MemoryTransport
from metronome_sdk.voice import SharedVoice, VoiceAgent
from metronome_sdk.voice._gate import SpeechGate
from metronome_sdk.webrtc import DEFAULT_PROMPT
from tests.voice.test_turns import TurnsSTT, _talk, ask_twice
from tests.webrtc.conftest import ToneTTS

pytestmark = pytest.mark.timeout(60)


def _wait_for(check: Callable[[], bool], seconds: float = 5.0) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.001)


def test_a_first_part_waiting_goes_before_later_parts_that_waited_longer() -> None:
    gate = SpeechGate()
    order: list[str] = []

    def speak(name: str, *, first: bool) -> None:
        with gate.hold(first=first):
            order.append(name)

    with gate.hold(first=False):  # a synthesis under way: everyone else waits
        later = threading.Thread(target=speak, args=("later",), kwargs={"first": False})
        later.start()
        time.sleep(0.05)  # the later part is waiting first
        first = threading.Thread(target=speak, args=("first",), kwargs={"first": True})
        first.start()
        _wait_for(lambda: gate.first_waiting == 1)
    later.join(5)
    first.join(5)
    assert order == ["first", "later"]
    assert gate.first_waiting == 0
    with gate.hold(first=False):  # free again: a later part goes in when nobody waits
        order.append("again")
    assert order[-1] == "again"


def test_the_gate_never_runs_two_at_once() -> None:
    gate = SpeechGate()
    inside = 0
    most = 0
    lock = threading.Lock()

    def speak(first: bool) -> None:
        nonlocal inside, most
        for _ in range(50):
            with gate.hold(first=first):
                with lock:
                    inside += 1
                    most = max(most, inside)
                time.sleep(0.0002)
                with lock:
                    inside -= 1

    threads = [threading.Thread(target=speak, args=(i % 2 == 0,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(20)
    assert most == 1 and inside == 0 and gate.first_waiting == 0


class SharedToneTTS(ToneTTS):
    """A tone voice that says which of its calls were a reply's first part."""

    def __init__(self) -> None:
        super().__init__(seconds=0.2)
        self.firsts: list[bool] = []

    def synthesize(self, text: str) -> tuple[npt.NDArray[np.int16], int]:
        self.firsts.append(False)
        return super().synthesize(text)

    def synthesize_first(self, text: str) -> tuple[npt.NDArray[np.int16], int]:
        self.firsts.append(True)
        return super().synthesize(text)


@pytest.mark.real_model
async def test_the_agent_asks_a_shared_voice_for_each_replys_first_part_first() -> None:
    tts = SharedToneTTS()
    assert isinstance(tts, SharedVoice) and not isinstance(ToneTTS(), SharedVoice)
    # SmolLM2 answers in words, so that a first part of two words leaves later parts to speak
    async with Engine() as engine, engine.session(DEFAULT_PROMPT) as session, MemoryTransport() as transport:
        questions = TurnsSTT("What is the capital of France?", "How many legs does a spider have?")
        agent = VoiceAgent(session, transport, stt=questions, tts=tts, max_reply_tokens=16, first_words=2)

        async def script(events: list[dict[str, object]]) -> None:
            await ask_twice(agent, transport, events)

        await _talk(agent, transport, script)
    # each reply: its first part through synthesize_first, its later parts through synthesize
    assert len(tts.firsts) == len(tts.spoken) >= 4, tts.spoken
    replies = "".join("F" if f else "." for f in tts.firsts)
    assert replies.count("F") == 2 and replies.startswith("F") and not replies.endswith("F"), (replies, tts.spoken)
    assert "F." in replies[1:], (replies, tts.spoken)


class SlowFirstPartTTS(ToneTTS):
    """A tone voice whose reply's first part takes 0.5 s (six ticks); it notes the frames the agent got meanwhile."""

    def __init__(self) -> None:
        super().__init__(seconds=0.2)
        self.events: list[dict[str, object]] = []  # the call's events, as the caller reads them
        self.frames_meanwhile: list[int] = []

    def _frames(self) -> int:
        return sum(e["type"] == "frame" for e in list(self.events))

    def synthesize_first(self, text: str) -> tuple[npt.NDArray[np.int16], int]:
        before = self._frames()
        time.sleep(0.5)
        self.frames_meanwhile.append(self._frames() - before)
        return super().synthesize(text)


@pytest.mark.real_model
async def test_a_reply_decodes_on_only_once_its_first_part_is_voiced() -> None:
    # the caller waits for the first part's voice; the rest of the reply has that part's playing time
    tts = SlowFirstPartTTS()
    async with Engine() as engine, engine.session(DEFAULT_PROMPT) as session, MemoryTransport() as transport:
        questions = TurnsSTT("What is the capital of France?", "How many legs does a spider have?")
        agent = VoiceAgent(session, transport, stt=questions, tts=tts, max_reply_tokens=16, first_words=2)

        async def script(events: list[dict[str, object]]) -> None:
            tts.events = events  # the voice counts its frames from its own thread, as they arrive
            await ask_twice(agent, transport, events)

        await _talk(agent, transport, script)
    # the frame that completed the part may reach the list after the voice began; none after it
    assert len(tts.frames_meanwhile) == 2 and max(tts.frames_meanwhile) <= 1, tts.frames_meanwhile
    assert len(tts.spoken) >= 4, tts.spoken  # each reply went on after its first part
