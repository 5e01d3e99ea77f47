"""Short spoken-style questions with the key words a right answer contains.

``metronome bench voice`` speaks them to the demo; ``metronome eval answers`` asks them as
text and counts the answers that carry a key word and are in English.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["QUESTIONS", "Question"]


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
