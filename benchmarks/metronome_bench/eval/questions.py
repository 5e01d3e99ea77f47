"""Short spoken-style questions with the key words a right answer contains.

``metronome bench voice`` speaks them to the demo; ``metronome eval answers`` asks them as
text and counts the answers that carry a key word and are in English. ``QUESTIONS`` is the
set a default (the demo's prompt) is chosen on; ``HELD_OUT`` was written before any prompt
was scored on it and is never used to choose, so its score is the forecast of a new question.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["HELD_OUT", "QUESTIONS", "Question"]


@dataclass(frozen=True, slots=True)
class Question:
    """What a caller says, and the words (any one of them, lower case) a right answer holds."""

    text: str
    keys: tuple[str, ...]


# what a caller asks a voice assistant: facts a 135M model knows, 4 to 9 words, no names to mishear
QUESTIONS: tuple[Question, ...] = (
    Question("What is the capital of France?", ("paris",)),
    Question("How many legs does a spider have?", ("eight", "8")),
    Question("What color is the sky on a clear day?", ("blue",)),
    Question("What do bees make?", ("honey",)),
    Question("What is the opposite of hot?", ("cold",)),
    Question("How many days are in a week?", ("seven", "7")),
    Question("What is the largest planet in our solar system?", ("jupiter",)),
    Question("What animal says moo?", ("cow",)),
    Question("What do we call frozen water?", ("ice",)),
    Question("What is the largest ocean on Earth?", ("pacific",)),
    Question("What is two plus two?", ("four", "4")),
    Question("Who wrote Romeo and Juliet?", ("shakespeare",)),
    Question("What is the capital of Japan?", ("tokyo",)),
    Question("What gas do plants take in from the air?", ("carbon dioxide", "co2")),
    Question("How many hours are in a day?", ("24", "twenty-four", "twenty four")),
    Question("What is the boiling point of water in Celsius?", ("100", "hundred")),
)

# the same kind of questions, kept apart: a prompt chosen on QUESTIONS is scored here
HELD_OUT: tuple[Question, ...] = (
    Question("What color is grass?", ("green",)),
    Question("How many wheels does a bicycle have?", ("two", "2")),
    Question("What is the capital of Italy?", ("rome",)),
    Question("What do cows drink?", ("water",)),
    Question("What is the opposite of up?", ("down",)),
    Question("How many months are in a year?", ("twelve", "12")),
    Question("What planet do we live on?", ("earth",)),
    Question("What animal barks?", ("dog",)),
    Question("What falls from clouds when it rains?", ("water", "raindrops", "drops")),
    Question("What is the closest star to Earth?", ("sun",)),
    Question("What is three plus three?", ("six", "6")),
    Question("What color is a banana?", ("yellow",)),
    Question("What is the capital of England?", ("london",)),
    Question("What do fish breathe through?", ("gills",)),
    Question("How many minutes are in an hour?", ("sixty", "60")),
    Question("What is the freezing point of water in Celsius?", ("zero", "0")),
)
