"""Timing of distributed steps: measure in ranks, judge against hardware-keyed launch histories, report.

measure      ``benchmark(dist, fn, ...)`` -> ``Measurement`` (``TaskSpec`` says what ran)
inrank       the rank side: warmup, then step and in-run reference A B A B, peak memory
reference    the fixed reference workload and its hash
stats        pure statistics: Mann-Whitney U, Student's t (no scipy)
rule         the gate: x = ln(step/reference) vs the launch history (t prediction interval + effect);
             ``decide``: the one function behind pytest's and compare's history verdicts
gate         the previous rule (Mann-Whitney vs one launch), for comparison and information
fingerprint  the hardware fingerprint baseline files are named by
baselines    one readable JSON file per fingerprint, a history of launches per measurement
state        the per-process bookkeeping of the timing plugin
revision     --mgpu-against=REV: the same benchmark on two sets of ranks, the working tree's and REV's
revision_rank  inside those ranks: set up, then take turns with the other side through a store
pairing      the head/base ratio of the pairs, its 99% bootstrap interval and verdict (``judge_pairs``)
worktree     the temporary git worktree of REV; units: how times and sizes are written
messages     verdict cells and failure text; report: rows and Markdown/JSON/CSV; plots: PNG charts
plugin       the pytest hooks, registered from pytest_configure; compare: ``python -m pytest_mgpu compare``
"""
from .measure import Measurement, TaskSpec, benchmark
from .rule import HistoryVerdict, Status, judge_history

__all__ = ["HistoryVerdict", "Measurement", "Status", "TaskSpec", "benchmark", "judge_history"]
