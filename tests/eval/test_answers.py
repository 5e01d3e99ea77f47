"""``metronome eval answers``: how an answer is judged (the real model's run is the command itself)."""

from __future__ import annotations

import pytest

from metronome_bench.eval.answers import PROMPTS, echoes, is_english, is_right
from metronome_bench.eval.questions import HELD_OUT, QUESTIONS, Question
from metronome_sdk.cli import build_parser
from metronome_sdk.webrtc import DEFAULT_PROMPT

PARIS = Question("What is the capital of France?", ("paris",))


def test_a_right_answer_holds_a_key_word_in_english() -> None:
    assert is_right(PARIS, "The capital of France is Paris.")
    assert is_right(PARIS, "Paris.")  # no function words either way: English enough
    assert not is_right(PARIS, "Le Grand Paris, la femme de la France.")  # the key word, in French
    assert not is_right(PARIS, "The capital of France is Lyon.")
    assert not is_right(PARIS, "Parisians love it.")  # a whole word, not a part of one


def test_numbers_and_words_with_hyphens_count() -> None:
    hours = next(q for q in QUESTIONS if "hours" in q.text)
    assert is_right(hours, "A day has 24 hours.")
    assert is_right(hours, "There are twenty-four hours in a day.")
    assert not is_right(hours, "A day is approximately 86,400 seconds.")
    gas = next(q for q in QUESTIONS if "gas" in q.text)
    assert is_right(gas, "They take in CO2.")


@pytest.mark.parametrize(
    ("text", "english"),
    [
        ("The sky is blue.", True),
        ("Le ciel est bleu et la mer aussi.", False),
        ("El cielo es azul y el mar también.", False),
        ("Der Himmel ist blau und das Meer auch.", False),
        ("Café au lait.", False),  # accents are no English spelling
        ("Blue.", True),
    ],
)
def test_english_is_judged_by_function_words(text: str, english: bool) -> None:
    assert is_english(text) is english


def test_the_demos_prompt_is_among_those_tried() -> None:
    assert DEFAULT_PROMPT in PROMPTS
    assert all(q.keys and all(k == k.lower() for k in q.keys) for q in QUESTIONS + HELD_OUT)


def test_the_held_out_questions_are_apart_and_give_no_answer_away() -> None:
    assert not {q.text for q in QUESTIONS} & {q.text for q in HELD_OUT}
    assert len(HELD_OUT) == len(QUESTIONS)
    for q in QUESTIONS + HELD_OUT:  # a key in the question would count an echo of it as right
        assert not any(is_right(Question(q.text, (k,)), q.text) for k in q.keys), q.text


def test_the_command_parses_its_options() -> None:
    args = build_parser().parse_args(["eval", "answers", "--prompt", "Be brief.", "--prompt", "none", "--json"])
    assert (args.prompt, args.max_tokens, args.json, args.set) == (["Be brief.", "none"], 48, True, "both")
    assert build_parser().parse_args(["eval", "answers", "--set", "held-out"]).set == "held-out"
    args = build_parser().parse_args(["eval", "answers", "--turns", "6", "--history"])
    assert (args.turns, args.history) == (6, True)
    args = build_parser().parse_args(["eval", "answers"])
    assert (args.turns, args.history) == (1, False)  # each question on its own, each turn taken back


def test_an_answer_echoes_when_it_opens_as_an_earlier_one_of_its_call() -> None:
    earlier = ['The answer to this question is "Blue"', "The capital of France is Paris."]
    assert echoes('The answer to this question is "London"', earlier)
    assert echoes("the ANSWER to this, question", earlier)  # words, not case or punctuation
    assert not echoes("The capital of Italy is Rome.", earlier)  # three words alike is a sentence's frame
    assert not echoes("The answer to", earlier)  # too short to say
    assert not echoes('The answer to this question is "Blue"', [])  # a call's first answer echoes nothing


@pytest.mark.real_model
@pytest.mark.timeout(300)
async def test_a_call_that_takes_each_turn_back_answers_each_question_as_if_alone() -> None:
    from metronome_bench.eval.answers import ask

    questions = QUESTIONS[:3]
    [alone] = await ask([DEFAULT_PROMPT], questions, max_tokens=16)
    [call] = await ask([DEFAULT_PROMPT], questions, max_tokens=16, turns=3)
    [kept] = await ask([DEFAULT_PROMPT], questions, max_tokens=16, turns=3, history=True)

    def same(x: str, y: str) -> bool:  # a frame carries up to 4 tokens as the tick has room: the cut moves
        return x.startswith(y) or y.startswith(x)

    assert all(same(c.answer, a.answer) for c, a in zip(call.answers, alone.answers, strict=True))
    assert same(kept.answers[0].answer, alone.answers[0].answer)  # a call's first question has no history
    assert not all(same(k.answer, a.answer) for k, a in zip(kept.answers, alone.answers, strict=True))
