"""``metronome eval voice``: each recognizer's word error rate on prompts spoken at run time by several voices."""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable
from typing import TYPE_CHECKING

from metronome_sdk.cli import Command

from ._output import emit_json, print_table, progress_bar

if TYPE_CHECKING:
    from metronome_sdk.voice import TextToSpeech

# whisper-30s: the same model reading Whisper's full 30 s window, beside the default 10 s one
RECOGNIZERS = ("whisper", "whisper-30s", "pocketsphinx")
VOICES = ("piper-joe", "espeak-en-us", "espeak-en-gb")


def _names(allowed: tuple[str, ...], what: str) -> type:
    def parse(text: str) -> tuple[str, ...]:
        names = tuple(n.strip() for n in text.split(",") if n.strip())
        unknown = [n for n in names if n not in allowed]
        if not names or unknown:
            raise argparse.ArgumentTypeError(f"--{what} takes some of {','.join(allowed)}, got {text!r}")
        return names

    return parse  # type: ignore[return-value]


def open_voices(stack: contextlib.ExitStack, names: tuple[str, ...]) -> list[tuple[str, TextToSpeech]]:
    """The voices named (``piper-joe``, ``espeak-<voice>``); Piper's process stops with ``stack``."""
    from metronome_sdk.voice import EspeakTTS, PiperTTS

    voices: list[tuple[str, TextToSpeech]] = []
    for name in names:
        if name == "piper-joe":
            voices.append((name, stack.enter_context(PiperTTS())))
        else:
            try:
                voices.append((name, EspeakTTS(voice=name.removeprefix("espeak-"), speed=160)))
            except FileNotFoundError as exc:
                raise ValueError(f"{exc} (or leave espeak-ng out: --voices piper-joe)") from exc
    return voices


def _add(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--recognizers",
        type=_names(RECOGNIZERS, "recognizers"),
        default=RECOGNIZERS,
        help=f"comma-separated (default {','.join(RECOGNIZERS)})",
    )
    p.add_argument(
        "--voices", type=_names(VOICES, "voices"), default=VOICES, help=f"comma-separated (default {','.join(VOICES)})"
    )
    p.add_argument("--prompts", type=int, default=None, help="the first N of the ten prompts (default all)")
    p.add_argument("--json", action="store_true", help="print JSON")


def _run(args: argparse.Namespace) -> int:
    from metronome_sdk.voice import PocketSphinxSTT, SpeechToText, WhisperSTT

    from ..eval.voice import PROMPTS, measure_each

    prompts = PROMPTS if args.prompts is None else PROMPTS[: args.prompts]
    if args.prompts is not None and not 1 <= args.prompts <= len(PROMPTS):
        raise ValueError(f"--prompts must be in [1, {len(PROMPTS)}], got {args.prompts}")
    with contextlib.ExitStack() as stack:
        voices = open_voices(stack, args.voices)
        make: dict[str, Callable[[], SpeechToText]] = {
            "whisper": WhisperSTT,
            "whisper-30s": lambda: WhisperSTT(window=30),
            "pocketsphinx": PocketSphinxSTT,
        }
        recognizers = [(name, make[name]()) for name in args.recognizers]
        with progress_bar(len(prompts) * len(voices) * len(recognizers), "prompts heard") as bar:
            heard = [measure_each(recognizers, v, prompts, on_prompt=lambda: bar.update(1)) for v in voices]
        results = [r for name in args.recognizers for per_voice in heard for r in per_voice if r.recognizer == name]
    if args.json:
        emit_json({"prompts": list(prompts), "results": [r.as_dict() for r in results]})
        return 0
    rows = [[r.recognizer, r.voice, r.words, r.errors, f"{100 * r.wer:.1f}%", r.real_time] for r in results]
    for name in args.recognizers:
        mine = [r for r in results if r.recognizer == name]
        words, errors = sum(r.words for r in mine), sum(r.errors for r in mine)
        rows.append([name, "all voices", words, errors, f"{100 * errors / words:.1f}%", None])
    print_table(["recognizer", "voice", "words", "errors", "WER", "real time"], rows)
    print(
        f"{len(prompts)} prompts, spoken now by each voice, each take heard by every recognizer; "
        "'real time': seconds transcribing per second of speech"
    )
    return 0


EVAL_VOICE = Command(
    "eval",
    "voice",
    "word error rate of each recognizer on prompts spoken at run time by Piper and espeak-ng",
    _add,
    _run,
)
