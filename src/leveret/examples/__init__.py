"""Runnable examples: `python -m leveret.examples.clicks`."""
