"""Where the voice may start: ``clause_end`` cuts a reply into the parts spoken one after the other."""

from __future__ import annotations

import pytest

from metronome_sdk.voice._agent import clause_end


def _parts(deltas: list[str], *, min_words: int = 3) -> list[str]:
    """The parts the agent would send to the voice, token by token, the last one at the reply's end."""
    parts, pending = [], ""
    for delta in deltas:
        pending += delta
        while (end := clause_end(pending, first=not parts, min_words=min_words)) is not None:
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
