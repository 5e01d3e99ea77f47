"""Input frames: text through the chat template, audio through the frame codec, tokens as given."""

from __future__ import annotations

import numpy as np
import pytest

from metronome_engine import KVPolicy
from metronome_sdk import FixedRateCodec, InputFrame
from tests.engine.tiny import VOCAB
from tests.sdk.conftest import STOP, CharTokenizer, make_engine

pytestmark = pytest.mark.timeout(60)


def tone(n: int, amplitude: float) -> np.ndarray:
    return (amplitude * np.sin(np.linspace(0, 200, n))).astype(np.float32)


def test_codec_makes_a_fixed_number_of_tokens_whatever_the_frame_length() -> None:
    codec = FixedRateCodec(tokens_per_frame=6)
    for n in (6, 160, 1280, 5000):
        ids = codec.encode(tone(n, 0.5), 16000)
        assert len(ids) == 6
        assert all(codec.first_id <= i < codec.first_id + codec.levels for i in ids)


def test_codec_maps_loudness_to_levels_and_int16_like_float32() -> None:
    codec = FixedRateCodec(tokens_per_frame=4)
    quiet = codec.encode(tone(1280, 0.001), 16000)
    loud = codec.encode(tone(1280, 0.9), 16000)
    assert max(quiet) < min(loud)
    pcm16 = (tone(1280, 0.5) * 32767).astype(np.int16)
    as_int = codec.encode(InputFrame.from_audio(pcm16, sample_rate=16000).samples_float32(), 16000)
    assert as_int == codec.encode(tone(1280, 0.5), 16000)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"audio": np.zeros((2, 160), np.float32), "sample_rate": 16000}, "mono"),
        ({"audio": np.zeros(160, np.float64), "sample_rate": 16000}, "dtype"),
        ({"audio": np.zeros(160, np.int16), "sample_rate": 0}, "sample_rate"),
        ({"audio": np.zeros(0, np.int16), "sample_rate": 16000}, "no samples"),
        ({"text": "hi", "tokens": (1,)}, "one of"),
        ({"tokens": ()}, "empty"),
        ({"tokens": (1, -2)}, "token ids"),
        ({"text": "hi", "sample_rate": 8000}, "sample_rate"),
    ],
)
def test_bad_frames_name_what_is_wrong(kwargs: dict[str, object], field: str) -> None:
    with pytest.raises(ValueError, match=field):
        InputFrame(**kwargs)  # type: ignore[arg-type]


async def test_audio_frames_grow_the_kv_at_a_constant_rate() -> None:
    engine = make_engine(KVPolicy.full(), num_blocks=64, codec=FixedRateCodec(tokens_per_frame=5))
    async with engine, engine.session() as s:
        lengths = []
        for n in (160, 1280, 320, 2000):  # different frame lengths, same token count
            await s.step(InputFrame.from_audio(tone(n, 0.3), sample_rate=16000))
            lengths.append(s.stats().num_tokens)
        assert np.diff(lengths).tolist() == [6, 6, 6]  # 5 codec tokens + the fed-back output token


async def test_text_turns_use_the_chat_template_and_the_system_prompt_is_prefilled() -> None:
    tok = CharTokenizer()
    async with make_engine() as engine, engine.session("be brief") as s:
        await s.step("hi")
        system = tok.chat([{"role": "system", "content": "be brief"}], add_generation_prompt=False)
        first_turn = [2, *tok.encode("uhi"), STOP, 2]
        assert s.stats().num_tokens == len(system) + len(first_turn)
        await s.step("ok")
        assert s.stats().num_tokens == len(system) + len(first_turn) + 1 + len(first_turn)


async def test_long_input_is_split_across_ticks() -> None:
    ticks: list[int] = []
    engine = make_engine(KVPolicy.full(), num_blocks=64, on_tick=lambda r: ticks.append(r.served))
    async with engine, engine.session() as s:
        out = await s.step(InputFrame.from_tokens(range(10, 30)))  # 20 tokens, 8 a tick
        assert out.tokens
        assert len(ticks) == 3
        assert s.stats().num_tokens == 20


async def test_empty_frames_keep_the_model_talking() -> None:
    async with make_engine() as engine, engine.session() as s:
        first = await s.step(InputFrame.from_tokens([40, 41]))
        nxt = await s.step()  # nothing heard: the last output is appended, the next decoded
        assert first.tokens and nxt.tokens
        assert s.stats().num_tokens == 3
        assert nxt.index == 1


class NeverStops(CharTokenizer):
    stop_ids = frozenset()


class AlwaysStops(CharTokenizer):
    stop_ids = frozenset(range(VOCAB))


@pytest.mark.parametrize(("tokenizer", "frames"), [(NeverStops(), 5), (AlwaysStops(), 1)])
async def test_chat_collects_the_reply_until_the_turn_ends_or_max_tokens(tokenizer: CharTokenizer, frames: int) -> None:
    async with make_engine(tokenizer=tokenizer) as engine, engine.session() as s:
        reply = await s.chat("hello", max_tokens=5)
        assert s.stats().frames == frames
        assert isinstance(reply, str)


async def test_first_frame_must_carry_input() -> None:
    async with make_engine() as engine, engine.session() as s:
        with pytest.raises(ValueError, match="first frame"):
            await s.send(None)


async def test_tokens_outside_the_vocabulary_are_refused_before_the_step() -> None:
    async with make_engine() as engine, engine.session() as s:
        with pytest.raises(ValueError, match="vocabulary"):
            await s.send(InputFrame.from_tokens([10_000]))
        assert (await s.step(InputFrame.from_tokens([4]))).tokens  # the session is unharmed


async def test_text_needs_a_tokenizer() -> None:
    from metronome_sdk import Engine, TimingConfig
    from tests.engine.tiny import tiny_engine

    engine = Engine(core=tiny_engine(KVPolicy.windowed(8, sinks=4), num_blocks=32), timing=TimingConfig(period=0.001))
    async with engine, engine.session() as s:
        with pytest.raises(ValueError, match="tokenizer"):
            await s.send("hello")


async def test_an_audio_frame_without_a_codec_is_refused_naming_codec_and_queues_nothing() -> None:
    async with make_engine(KVPolicy.full(), num_blocks=64) as engine, engine.session() as s:
        assert engine.codec is None  # no stand-in codec by default
        with pytest.raises(ValueError, match="codec="):
            await s.send(InputFrame.from_audio(tone(1280, 0.3), sample_rate=16000))
        assert s.stats().num_tokens == 0 and s.stats().queued_inputs == 0
        await s.step(InputFrame.from_tokens([5, 6]))  # the session goes on with what it can take
        assert s.stats().num_tokens == 2  # its two tokens (the output is fed back with the next frame)
