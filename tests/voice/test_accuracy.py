"""Word error rate: the counting, the command, and the bound the default recognizer stays under."""

from __future__ import annotations

import json

import pytest

from metronome_bench.eval.voice import PROMPTS, measure, normalize, word_errors
from metronome_sdk.cli import main
from metronome_sdk.voice import EspeakTTS, PiperTTS, WhisperSTT

pytestmark = pytest.mark.timeout(300)

# Measured 2026-12-01 (`metronome eval voice`, 10 prompts x 3 voices): Whisper tiny.en made 13 errors
# in 225 words (5.8%); by voice 4.0% (Piper joe), 4.0% (espeak-ng en-us), 9.3% (espeak-ng en-gb).
# Piper's voice varies a little from run to run, so the bounds leave room above those figures.
WER_BOUND = 0.10
WER_BOUND_PER_VOICE = 0.15


def test_word_errors_count_substitutions_deletions_and_insertions() -> None:
    assert normalize("Who wrote Romeo-and-Juliet? Dr. Smith's!") == [
        "who",
        "wrote",
        "romeo",
        "and",
        "juliet",
        "doctor",
        "smith's",
    ]
    assert word_errors("What is the capital of France?", "what is the capital of france") == 0
    assert word_errors("the cat sat", "the bat sat") == 1  # a substitution
    assert word_errors("the cat sat", "the sat") == 1  # a deletion
    assert word_errors("the cat sat", "the cat sat down") == 1  # an insertion
    assert word_errors("the cat sat", "") == 3
    assert word_errors("", "hello there") == 2


def test_eval_voice_prints_each_recognizers_word_error_rate(capsys: pytest.CaptureFixture[str]) -> None:
    args = ["eval", "voice", "--prompts", "2", "--voices", "espeak-en-us", "--json"]
    assert main(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["prompts"] == list(PROMPTS[:2])
    rows = {(r["recognizer"], r["voice"]): r for r in report["results"]}
    assert set(rows) == {(name, "espeak-en-us") for name in ("whisper", "whisper-30s", "pocketsphinx")}
    assert all(r["words"] == 12 and r["errors"] >= 0 and r["real_time"] > 0 for r in rows.values())
    assert rows[("whisper", "espeak-en-us")]["wer"] < rows[("pocketsphinx", "espeak-en-us")]["wer"]
    assert main(["eval", "voice", "--prompts", "2", "--recognizers", "whisper", "--voices", "espeak-en-us"]) == 0
    table = capsys.readouterr().out
    assert "whisper" in table and "all voices" in table and "WER" in table
    with pytest.raises(SystemExit):
        main(["eval", "voice", "--voices", "nobody"])
    assert main(["eval", "voice", "--prompts", "11"]) == 2


@pytest.mark.slow
def test_the_default_recognizer_stays_under_its_word_error_rate_bound() -> None:
    stt = WhisperSTT()
    with PiperTTS() as piper:
        voices = [("piper-joe", piper), ("espeak-en-us", EspeakTTS(voice="en-us", speed=160))]
        voices.append(("espeak-en-gb", EspeakTTS(voice="en-gb", speed=160)))
        results = [measure(("whisper", stt), voice) for voice in voices]
    for r in results:
        print(f"{r.voice}: {r.errors}/{r.words} = {r.wer:.1%}; worst {r.worst}")
    assert all(r.wer <= WER_BOUND_PER_VOICE for r in results)
    assert sum(r.errors for r in results) / sum(r.words for r in results) <= WER_BOUND
