"""Where the voice may start: ``clause_end`` cuts a reply into the parts spoken one after the other."""

from __future__ import annotations

import pytest

from metronome_sdk.voice._agent import clause_end


def _parts(deltas: list[str], *, min_words: int = 3, max_words: int | None = None) -> list[str]:
    """The parts the agent would send to the voice, token by token, the last one at the reply's end."""
    parts, pending = [], ""
    for delta in deltas:
        pending += delta
        while (end := clause_end(pending, first=not parts, min_words=min_words, max_words=max_words)) is not None:
            if not pending[:end].strip():
                break
            parts.append(pending[:end].strip())
            pending = pending[end:]
    if pending.strip():
        parts.append(pending.strip())
    return parts


def test_the_first_clause_goes_at_a_comma_later_ones_at_sentence_ends() -> None:
    deltas = ["The", " sky", " on", " a", " clear", " day", ",", " seen", " from", " here", ",", " is", " blue", "."]
    deltas += [" It", " is", ",", " really", "."]
    assert _parts(deltas) == ["The sky on a clear day,", "seen from here, is blue.", "It is, really."]


def test_a_short_opening_waits_for_more_words() -> None:
    assert _parts(["Yes", ",", " the", " capital", " is", " Paris", "."]) == ["Yes, the capital is Paris."]
    assert _parts(["Yes", ",", " it", " is", "."], min_words=1) == ["Yes,", "it is."]


@pytest.mark.parametrize(
    ("text", "end"),
    [
        ("Paris.", 6),
        ("Paris. It", 6),
        ("Wait!? No", 6),
        ("It is 3", None),
        ("It is 3.", None),  # "3.5" may follow: the next token says
        ("It is 3.5 metres.", 17),
        ("About 1,000 legs", None),
        ("A spider has eight legs;", 24),
        ("", None),
    ],
)
def test_marks_inside_numbers_are_no_ends(text: str, end: int | None) -> None:
    assert clause_end(text, first=False, min_words=3) == end


def test_a_long_first_sentence_goes_after_max_words_whole_words() -> None:
    deltas = ["The", " sky", " on", " a", " clear", " day", " is", " usually", " blue", "."]
    deltas += [" It", " is", " a", " long", " story", " with", " no", " comma", "."]
    # the sixth word is whole once the seventh starts; later sentences keep their ends
    assert _parts(deltas, max_words=6) == [
        "The sky on a clear day",
        "is usually blue.",
        "It is a long story with no comma.",
    ]
    assert _parts(deltas) == ["The sky on a clear day is usually blue.", "It is a long story with no comma."]


def test_a_mark_before_max_words_still_ends_the_first_part() -> None:
    assert _parts(["The", " capital", " of", " France", " is", " Paris", ".", " Yes", "."], max_words=6) == [
        "The capital of France is Paris.",
        "Yes.",
    ]
    assert _parts(["Well", ",", " the", " answer", ",", " I", " think", " is", " no", "."], max_words=4) == [
        "Well, the answer,",
        "I think is no.",
    ]


@pytest.mark.parametrize(
    ("text", "end"),
    [
        ("one two three four", None),  # the fourth word may go on: "fourteen"
        ("one two three four ", 18),
        ("one two three four five", 18),
        ("It is 3.5 metres long", 16),
        ("One, two three four five", 19),  # a comma before clause_words words is no end; the cap is
    ],
)
def test_max_words_counts_whole_words_only(text: str, end: int | None) -> None:
    assert clause_end(text, first=True, min_words=3, max_words=4) == end
    assert clause_end(text, first=False, min_words=3, max_words=4) is None  # only the first part is capped
