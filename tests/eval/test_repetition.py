from __future__ import annotations

import pytest

from metronome_bench.eval.repetition import distinct_n, repeated_ngram_fraction


def test_repeated_4grams_and_distinct_2_on_known_strings() -> None:
    words = ["a", "b", "c", "d", "a", "b", "c", "d"]
    # 4-grams: abcd bcda cdab dabc abcd -> one of five repeats an earlier one
    assert repeated_ngram_fraction(words, 4) == pytest.approx(0.2)
    # bigrams: ab bc cd da ab bc cd -> four distinct of seven
    assert distinct_n(words, 2) == pytest.approx(4 / 7)
    assert repeated_ngram_fraction(list("abcdefgh"), 4) == 0.0
    assert distinct_n(list("abcdefgh"), 2) == 1.0
    loop = list("xy" * 50)
    assert repeated_ngram_fraction(loop, 4) > 0.95
    assert distinct_n(loop, 2) == pytest.approx(2 / 99)


def test_too_short_texts_and_bad_n() -> None:
    assert repeated_ngram_fraction(["a", "b"], 4) == 0.0
    assert distinct_n([], 2) == 0.0
    with pytest.raises(ValueError, match="n must be"):
        distinct_n(["a"], 0)
