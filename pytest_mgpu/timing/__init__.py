"""Timing of distributed steps: measure in ranks, judge against hardware-keyed baselines, report.

measure    ``benchmark(dist, fn, ...)`` -> ``Measurement`` (``TaskSpec`` says what ran)
gate       Mann-Whitney U and effect size -> ``Verdict``
baselines  one readable JSON file per hardware fingerprint, atomic merges
state      the per-process bookkeeping the plugin keeps in its stash
report     rows, speed-up and efficiency; terminal/Markdown/JSON/CSV
plots      PNG charts (matplotlib, optional)
"""
from .gate import Verdict, judge, mann_whitney
from .measure import Measurement, TaskSpec, benchmark

__all__ = ["Measurement", "TaskSpec", "Verdict", "benchmark", "judge", "mann_whitney"]
