"""Benchmarks (``metronome bench ...``): every figure measured in the run that prints it."""
