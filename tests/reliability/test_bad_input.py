"""Bad input, fuzzed: every bad frame or setting gets a ValueError naming the field; nothing accepted is lost."""

from __future__ import annotations

import asyncio
import math
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from metronome_engine import EngineCore, KVPolicy, SamplingParams
from metronome_sdk import (
    AdmissionConfig,
    Engine,
    EngineConfig,
    InputFrame,
    ReliabilityConfig,
    TimingConfig,
)
from metronome_sdk._frames import MAX_AUDIO_SECONDS, MAX_FRAME_TOKENS, MAX_SAMPLE_RATE, MAX_TEXT_CHARS
from tests.engine.tiny import VOCAB, tiny_engine

pytestmark = pytest.mark.timeout(120)

FUZZ = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# values of every kind a caller might pass by mistake
ANY_VALUE = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.sampled_from([0, 1, -1, 2**31, 2**63, 2**64]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, 1.0, -0.0, 1e-300, 1e300, math.nan, math.inf, -math.inf]),
    st.text(max_size=8),
    st.lists(st.integers(), max_size=3),
    st.just(object()),
)

AUDIO_DTYPES = [np.int16, np.float32, np.float64, np.int32, np.int8, np.uint16, np.complex64, np.bool_, object]


@st.composite
def audio_frames(draw: st.DrawFn) -> tuple[Any, Any]:
    dtype = draw(st.sampled_from(AUDIO_DTYPES))
    shape = draw(st.sampled_from([(), (0,), (1,), (160,), (1280,), (2, 160), (160, 1), (1, 1, 8)]))
    audio: Any = np.zeros(shape, dtype=dtype)
    if dtype is np.float32 and audio.size and draw(st.booleans()):
        audio.flat[draw(st.integers(0, audio.size - 1))] = draw(st.sampled_from([np.nan, np.inf, -np.inf]))
    rate = draw(
        st.one_of(
            st.sampled_from([8000, 16000, 24000, 48000, MAX_SAMPLE_RATE, MAX_SAMPLE_RATE + 1]),
            ANY_VALUE,
        )
    )
    return audio, rate


AUDIO_FIELDS = ("audio", "sample_rate", "dtype", "mono", "samples", "sample")


@FUZZ
@given(audio_frames())
def test_fuzzed_audio_is_accepted_only_when_valid_else_named(case: tuple[Any, Any]) -> None:
    audio, rate = case
    try:
        frame = InputFrame.from_audio(audio, sample_rate=rate)
    except ValueError as exc:
        assert any(f in str(exc) for f in AUDIO_FIELDS), str(exc)
        return
    # accepted: then it really is one mono frame of PCM the codec can take
    assert frame.audio is not None and frame.audio.dtype in (np.int16, np.float32) and frame.audio.ndim == 1
    assert isinstance(rate, int) and 1 <= rate <= MAX_SAMPLE_RATE
    assert 0 < frame.audio.size <= MAX_AUDIO_SECONDS * rate
    assert np.isfinite(frame.samples_float32()).all()


def test_huge_audio_and_absurd_text_and_token_frames_are_refused() -> None:
    with pytest.raises(ValueError, match=r"audio holds .* s .*split the audio"):
        InputFrame.from_audio(np.zeros(int(16000 * (MAX_AUDIO_SECONDS + 1)), np.int16), sample_rate=16000)
    with pytest.raises(ValueError, match="text holds"):
        InputFrame.from_text("a" * (MAX_TEXT_CHARS + 1))
    with pytest.raises(ValueError, match="text is not valid Unicode"):
        InputFrame.from_text("half a pair: \ud800")
    with pytest.raises(ValueError, match="tokens holds"):
        InputFrame.from_tokens(range(MAX_FRAME_TOKENS + 1))
    with pytest.raises(ValueError, match="tokens must be"):
        InputFrame.from_tokens("abc")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="text must be a str"):
        InputFrame(text=b"bytes")  # type: ignore[arg-type]


@FUZZ
@given(st.one_of(st.text(max_size=64), st.binary(max_size=16), ANY_VALUE))
def test_fuzzed_text_is_accepted_only_when_valid_else_named(text: Any) -> None:
    try:
        frame = InputFrame(text=text)
    except ValueError as exc:
        assert "text" in str(exc)
        return
    assert isinstance(text, str) or text is None
    assert frame.kind in ("text", "empty")


_core: EngineCore | None = None


def shared_core() -> EngineCore:
    global _core
    if _core is None:
        _core = tiny_engine(KVPolicy.windowed(8, sinks=4), num_blocks=64)
    return _core


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(min_value=-5, max_value=3 * VOCAB), min_size=1, max_size=12))
def test_fuzzed_token_frames_out_of_range_are_refused_and_lose_nothing(tokens: list[int]) -> None:
    async def run() -> None:
        engine = Engine(
            core=shared_core(),
            timing=TimingConfig(period=0.001, deadline=60.0, max_chunk_tokens=8),
            admission=AdmissionConfig(queue_timeout=0.0),
        )
        async with engine, engine.session() as s, engine.session() as other:
            await s.send(InputFrame.from_tokens([5, 6]))  # accepted before the bad frame
            bad = any(not 0 <= t < VOCAB for t in tokens)
            try:
                await s.send(InputFrame.from_tokens(tokens))
            except ValueError as exc:
                assert bad and "tokens" in str(exc), str(exc)
            else:
                assert not bad
            await s.send(InputFrame.from_tokens([7]))  # accepted after it
            outs = [await s.receive() for _ in range(2 if bad else 3)]
            assert [o.index for o in outs] == list(range(len(outs)))  # in order, nothing lost
            assert (await other.step(InputFrame.from_tokens([8]))).tokens  # and nobody else noticed
        assert shared_core().pool_stats().used_blocks == 0

    asyncio.run(run())


# configuration: each field, any value -> accepted within its bounds, or a ValueError naming it

CONFIGS: dict[str, tuple[Any, dict[str, Any]]] = {
    "EngineConfig": (
        EngineConfig,
        {
            "model": lambda v: isinstance(v, str) and v,
            "kv": lambda v: v in ("window", "full"),
            "window": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1,
            "sinks": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
            "num_blocks": lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool) and v >= 1),
            "memory_bytes": lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool) and v >= 1),
            "block_size": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1,
            "device": lambda v: isinstance(v, str) and v,
        },
    ),
    "TimingConfig": (
        TimingConfig,
        {
            "period": lambda v: isinstance(v, int | float) and not isinstance(v, bool) and 0 < v < math.inf,
            "deadline": lambda v: (
                v is None or (isinstance(v, int | float) and not isinstance(v, bool) and 0 < v < math.inf)
            ),
            "max_chunk_tokens": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1,
            "tick_tokens": lambda v: (
                v is None or v == "auto" or (isinstance(v, int) and not isinstance(v, bool) and v >= 1)
            ),
            "step_share": lambda v: isinstance(v, int | float) and not isinstance(v, bool) and 0 < v <= 1,
        },
    ),
    "AdmissionConfig": (
        AdmissionConfig,
        {
            "initial_limit": lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 1024),
            "session_tokens": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1,
            "min_limit": lambda v: isinstance(v, int) and not isinstance(v, bool) and 1 <= v <= 1024,
            "max_limit": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1,
            "increase": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1,
            "decrease": lambda v: isinstance(v, int | float) and not isinstance(v, bool) and 0 < v < 1,
            "target": lambda v: isinstance(v, int | float) and not isinstance(v, bool) and 0 < v <= 1,
            "percentile": lambda v: isinstance(v, int | float) and not isinstance(v, bool) and 0 < v <= 1,
            "interval": lambda v: isinstance(v, int | float) and not isinstance(v, bool) and 0 < v < math.inf,
            "min_samples": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1,
            "queue_timeout": lambda v: isinstance(v, int | float) and not isinstance(v, bool) and 0 <= v < math.inf,
        },
    ),
    "ReliabilityConfig": (
        ReliabilityConfig,
        {
            "output_queue": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1,
            "slow_consumer": lambda v: v in ("shed", "drop_oldest"),
            "step_retries": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
            "watchdog": lambda v: isinstance(v, int | float) and not isinstance(v, bool) and 1 <= v < math.inf,
            "watchdog_floor": lambda v: isinstance(v, int | float) and not isinstance(v, bool) and 0 <= v < math.inf,
            "max_failed_ticks": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 1,
        },
    ),
    "SamplingParams": (
        SamplingParams,
        {
            "temperature": lambda v: isinstance(v, int | float) and not isinstance(v, bool) and 0 <= v <= 100,
            "top_k": lambda v: isinstance(v, int) and not isinstance(v, bool) and v >= 0,
            "top_p": lambda v: isinstance(v, int | float) and not isinstance(v, bool) and 0 < v <= 1,
            "seed": lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool) and 0 <= v < 2**63),
        },
    ),
}

FIELDS = [(name, field) for name, (_, fields) in CONFIGS.items() for field in fields]


@FUZZ
@given(st.sampled_from(FIELDS), ANY_VALUE)
def test_fuzzed_configuration_is_accepted_within_bounds_else_named(where: tuple[str, str], value: Any) -> None:
    name, field = where
    cls, fields = CONFIGS[name]
    valid = bool(fields[field](value))
    try:
        cls(**{field: value})
    except ValueError as exc:
        assert not valid, f"{name}({field}={value!r}) was refused: {exc}"
        assert field in str(exc), f"{name}({field}={value!r}): the message does not name the field: {exc}"
        return
    assert valid, f"{name}({field}={value!r}) was accepted"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"kind": "window", "window": 0}, "window"),
        ({"kind": "window", "window": True}, "window"),
        ({"kind": "window", "window": 8, "sinks": -1}, "sinks"),
        ({"kind": "window", "window": 8, "sinks": 1.5}, "sinks"),
        ({"kind": "full", "window": 8}, "window"),
        ({"kind": "sliding"}, "kind"),
        ({"kind": None}, "kind"),
    ],
)
def test_kv_policy_bounds_name_the_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        KVPolicy(**kwargs)


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: AdmissionConfig(initial_limit=1024, max_limit=1024), None),  # at the bound: fine
        (lambda: AdmissionConfig(initial_limit=5, max_limit=4), "initial_limit"),
        (lambda: AdmissionConfig(min_limit=3, initial_limit=2), "initial_limit"),
        (lambda: AdmissionConfig(decrease=1.0), "decrease"),
        (lambda: AdmissionConfig(target=1.0), None),
        (lambda: AdmissionConfig(queue_timeout=0.0), None),
        (lambda: ReliabilityConfig(watchdog=1.0), None),
        (lambda: ReliabilityConfig(watchdog=0.99), "watchdog"),
        (lambda: ReliabilityConfig(step_retries=0), None),
        (lambda: SamplingParams(temperature=100.0), None),
        (lambda: SamplingParams(temperature=100.000001), "temperature"),
        (lambda: SamplingParams(top_p=1.0), None),
        (lambda: SamplingParams(top_p=0.0), "top_p"),
        (lambda: EngineConfig(num_blocks=4, memory_bytes=1 << 20), "num_blocks"),
    ],
)
def test_configuration_at_and_just_past_its_bounds(make: Any, field: str | None) -> None:
    if field is None:
        make()
        return
    with pytest.raises(ValueError, match=field):
        make()


class FussyCodec:
    """A custom codec with a bug: it raises on loud frames."""

    def encode(self, samples: Any, sample_rate: int) -> list[int]:
        if float(np.abs(samples).max()) > 0.5:
            raise ZeroDivisionError("codec bug")
        return [40, 41, 42]


async def test_bad_audio_between_good_frames_loses_nothing() -> None:
    from tests.sdk.conftest import make_engine

    engine = make_engine(codec=FussyCodec())
    quiet = np.full(1280, 0.1, np.float32)
    async with engine, engine.session() as s, engine.session() as other:
        await s.send(InputFrame.from_audio(quiet, sample_rate=16000))
        with pytest.raises(ValueError, match="non-finite"):
            await s.send(InputFrame.from_audio(np.full(1280, np.nan, np.float32), sample_rate=16000))
        with pytest.raises(ValueError, match="audio: the codec"):
            await s.send(InputFrame.from_audio(np.full(1280, 0.9, np.float32), sample_rate=16000))
        await other.send(InputFrame.from_audio((quiet * 32767).astype(np.int16), sample_rate=48000))
        await s.send(InputFrame.from_audio(quiet, sample_rate=16000))
        outs = [await s.receive(), await s.receive()]
        assert [o.index for o in outs] == [0, 1] and all(o.tokens for o in outs)
        assert (await other.receive()).tokens
        assert s.stats().num_tokens == 3 + 1 + 3  # only the good frames (and one fed-back token) were appended
