"""Evaluations of the bound on the real model (``metronome eval ...``)."""
