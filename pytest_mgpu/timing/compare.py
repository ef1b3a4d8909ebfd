"""``python -m pytest_mgpu compare OLD NEW``: judge NEW's launches against OLD's, outside pytest.

OLD and NEW are baseline files (format 1 or 2) or JSON reports (``--mgpu-report=x.json``). Per
measurement key in both, NEW's latest launch is judged against OLD's history with the gate's rule
(``rule.judge_history`` on x = ln(step/reference)). When OLD has fewer than ``rule.MIN_HISTORY``
comparable launches (a single report, a format-1 file) and both sides carry samples, the previous
rule decides instead (Mann-Whitney on iterations AND the threshold, ``gate.judge``), and the table
says so: for bisects, where the two sides ran back to back on one machine. Exit status 1 when any
measurement is slower, 0 otherwise, 2 when a file cannot be read.
"""
from __future__ import annotations

import argparse
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional

from . import gate, rule
from .baselines import BaselineError, BaselineFile
from .report import build_rows, terminal_table


@dataclass
class Side:
    """One launch per key (``latest``) and, per key, the launches before it (``history``)."""

    latest: Dict[str, dict]  # key -> measurement-like dict
    history: Dict[str, List[float]]  # key -> x of earlier launches


def _from_baseline(f: BaselineFile) -> Side:
    latest, history = {}, {}
    for key, e in f.entries.items():
        last = e.launches[-1]
        info = e.info
        latest[key] = {
            "key": key, "median_s": last.median_s, "iqr_s": last.iqr_s, "x": last.x,
            "reference_hash": last.reference_hash, "samples_s": list(e.latest_samples_s),
            "task": {"name": key.rsplit("::", 1)[-1], "strategy": info.get("strategy", "?"),
                     "group": info.get("group", key.split("::")[0]), "params": info.get("params") or {},
                     "world_size": info.get("world_size", 1), "device_type": "cuda" if not f.fingerprint.emulated else "cpu",
                     "emulated": f.fingerprint.emulated, "batch_size": info.get("batch_size")},
            "fingerprint_key": f.fingerprint.key(),
        }
        history[key] = [ln.x for ln in e.launches if ln.x is not None and ln.reference_hash == last.reference_hash]
    return Side(latest, history)


def _from_report(doc: dict) -> Side:
    latest = {}
    for d in doc.get("measurements", []):
        latest[d["key"]] = dict(d)
    return Side(latest, {k: [d["x"]] if d.get("x") is not None else [] for k, d in latest.items()})


def load(path: Path) -> Side:
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise BaselineError(f"{path}: cannot be read ({exc})") from None
    if isinstance(doc, dict) and "measurements" in doc and "rows" in doc:
        return _from_report(doc)
    return _from_baseline(BaselineFile.read(path))


def judge_pair(old: Side, new: Side, key: str, threshold: float) -> dict:
    d = dict(new.latest[key])
    hist = old.history.get(key, [])
    if len(hist) >= rule.MIN_HISTORY:
        v = rule.judge_history(d.get("x"), hist, threshold)
        d["compare_rule"] = "history"
    else:
        before = old.latest[key]
        v = _samples_verdict(before.get("samples_s"), d.get("samples_s"), threshold, len(hist))
        d["compare_rule"] = "samples"
    d.update(verdict=v.to_dict(), gate_mode="fail", history_median_s=old.latest[key].get("median_s"),
             baseline_source="OLD")
    d.setdefault("rank_samples_s", [d.get("samples_s") or [d["median_s"]]])
    d.setdefault("slowest_rank", 0)
    d.setdefault("skew", 0.0)
    return d


def _samples_verdict(old: Optional[List[float]], new: Optional[List[float]], threshold: float,
                     n_hist: int) -> rule.HistoryVerdict:
    """Few launches on OLD's side: Mann-Whitney on iterations AND the threshold (the previous rule)."""
    if not old or not new:
        return rule.HistoryVerdict(rule.Status.LEARNING, None, n_hist, threshold)
    g = gate.judge(new, old, threshold)
    status = {gate.SLOWER: rule.Status.SLOWER, gate.FASTER: rule.Status.FASTER}.get(g.status, rule.Status.SAME)
    center = math.log(g.baseline_median)
    return rule.HistoryVerdict(status, math.log(g.new_median), n_hist, threshold, gate.ALPHA, center,
                               None, None, g.p_value)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pytest_mgpu compare", description=__doc__.split("\n\n")[0])
    ap.add_argument("old", type=Path, help="baseline file or JSON report to compare against")
    ap.add_argument("new", type=Path, help="baseline file or JSON report to judge")
    ap.add_argument("--regression", type=float, default=rule.DEFAULT_THRESHOLD * 100,
                    help="effect size in percent (default 10)")
    args = ap.parse_args(argv)
    try:
        old, new = load(args.old), load(args.new)
    except BaselineError as exc:
        print(f"compare: {exc}")
        return 2
    keys = sorted(set(old.latest) & set(new.latest))
    judged = [judge_pair(old, new, k, args.regression / 100.0) for k in keys]
    rows = build_rows([(d["key"], "passed", d) for d in judged])
    print(f"{len(keys)} measurement(s) in both; {len(set(new.latest) - set(old.latest))} only in NEW, "
          f"{len(set(old.latest) - set(new.latest))} only in OLD")
    if rows:
        print(terminal_table(rows))
    slower = [d["key"] for d in judged if d["verdict"]["status"] == rule.Status.SLOWER.value]
    for key in slower:
        print(f"SLOWER: {key}")
    return 1 if slower else 0
