"""``python -m pytest_mgpu compare OLD NEW``: judge NEW's launches against OLD's, outside pytest.

OLD and NEW are baseline files (format 1 or 2) or JSON reports (``--mgpu-report=x.json``). Per
measurement key in both, NEW's latest launch is judged against OLD's history of launches with the
function pytest judges it with (``rule.decide`` on x = ln(step/reference), with the same reference
workload), so that compare and the in-pytest row agree on the same data: fewer than
``rule.MIN_HISTORY`` launches on OLD's side is "learning k/5", as in pytest; an unstable measurement
is "unstable", never faster or slower. Mann-Whitney on the samples is shown as information only.
Rows of NEW's revision lane (``--mgpu-against``) are judged again from their pairs with
``pairing.judge_pairs``, the function pytest used. Exit status 1 when any measurement is slower, 0
otherwise, 2 when a file cannot be read.
"""
from __future__ import annotations

import argparse
import json
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from . import rule
from .baselines import BaselineError, BaselineFile
from .messages import noisy_lines
from .pairing import RevisionStatus, judge_pairs
from .report import build_rows, terminal_table
from .stats import mann_whitney


@dataclass
class Side:
    """One launch per key (``latest``) and, per key, every launch's (x, reference hash, median)."""

    latest: Dict[str, dict]  # key -> measurement-like dict
    launches: Dict[str, List[Tuple[Optional[float], Optional[str], float]]]


def _from_baseline(f: BaselineFile) -> Side:
    latest, launches = {}, {}
    for key, e in f.entries.items():
        last = e.launches[-1]
        info = e.info
        latest[key] = {
            "key": key, "median_s": last.median_s, "iqr_s": last.iqr_s, "x": last.x,
            "reference_hash": last.reference_hash or "", "samples_s": list(e.latest_samples_s),
            "task": {"name": key.rsplit("::", 1)[-1], "strategy": info.get("strategy", "?"),
                     "group": info.get("group", key.split("::")[0]), "params": info.get("params") or {},
                     "world_size": info.get("world_size", 1), "device_type": "cuda" if not f.fingerprint.emulated else "cpu",
                     "emulated": f.fingerprint.emulated, "batch_size": info.get("batch_size")},
            "fingerprint_key": f.fingerprint.key(),
        }
        launches[key] = [(ln.x, ln.reference_hash, ln.median_s) for ln in e.launches]
    return Side(latest, launches)


def _from_report(doc: dict) -> Side:
    latest = {d["key"]: dict(d) for d in doc.get("measurements", [])}
    launches = {k: [(d.get("x"), d.get("reference_hash") or None, d["median_s"])] for k, d in latest.items()
                if _kept(d)}
    return Side(latest, launches)


def _kept(d: dict) -> bool:
    """Whether pytest would record this measurement into a history: never an unstable one or the
    revision lane's, a noisy one only as ``rule.saves`` says."""
    if d.get("unstable") or d.get("lane_only"):
        return False
    v = d.get("verdict")
    return not v or rule.saves(rule.HistoryVerdict.from_dict(v), d.get("runner_load") or "")


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
    """NEW's measurement ``key`` judged against OLD's launches timed with the same reference."""
    d = dict(new.latest[key])
    same_ref = [(x, med) for x, h, med in old.launches.get(key, []) if (h or "") == (d.get("reference_hash") or "")]
    prior = d.get("verdict") or {}
    v = rule.decide(d.get("x"), [x for x, _ in same_ref], threshold, d.get("unstable") or "", prior.get("x_again"))
    if d.get("lane_only"):  # the revision lane's head turns: its pairs judge it, as in pytest
        v = rule.HistoryVerdict(rule.Status.NEW, None, 0, threshold)
    meds = sorted(med for _, med in same_ref)
    old_samples = (old.latest.get(key) or {}).get("samples_s")
    p = mann_whitney(d["samples_s"], old_samples).p_greater if d.get("samples_s") and old_samples else None
    d.update(verdict=v.to_dict(), gate_mode="fail", baseline_source="OLD", mann_whitney_p=p,
             history_median_s=statistics.median(meds) if meds else None)
    d.setdefault("rank_samples_s", [d.get("samples_s") or [d["median_s"]]])
    d.setdefault("slowest_rank", 0)
    d.setdefault("skew", 0.0)
    if d.get("revision"):
        d["revision"] = rejudge_revision(d["revision"], threshold)
    return d


def rejudge_revision(r: dict, threshold: float) -> dict:
    """A revision-lane result judged again from its pairs (at ``threshold``), as pytest judged it."""
    if not r.get("pairs_head") or (r.get("verdict") or {}).get("status") == RevisionStatus.UNCHANGED.value:
        return r  # new, the base failed, or REV's own code: nothing to judge
    blocks = r.get("pairs_block") or None  # reports written before blocks: one block
    return dict(r, verdict=judge_pairs(r["pairs_head"], r["pairs_base"], threshold, blocks).to_dict())


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
    lane_old = sum(1 for k in keys if old.latest[k].get("lane_only"))
    if lane_old:
        print(f"{lane_old} of OLD's were measured by its revision lane: no history launch, so NEW's are new there")
    if keys and all(len(old.launches.get(k, [])) < rule.MIN_HISTORY for k in keys):
        fewest = min(len(old.launches.get(k, [])) for k in keys)
        print(f"OLD holds fewer than {rule.MIN_HISTORY} launches per measurement (a report holds one): its rows are "
              f"learning and cannot fail; {rule.visible_with(fewest, args.regression / 100.0)}. To gate, compare against "
              "a baseline file with a history (baselines/<fingerprint>.json), or measure against a revision with "
              "--mgpu-against")
    if rows:
        print(terminal_table(rows))
    for line in noisy_lines(judged):
        print(line)
    slower = [d["key"] for d in judged if d["verdict"]["status"] == rule.Status.SLOWER.value]
    slower += [f"{d['key']} (against {d['revision']['rev']})" for d in judged
               if (d.get("revision") or {}).get("verdict", {}).get("status") == RevisionStatus.SLOWER.value]
    for key in slower:
        print(f"SLOWER: {key}")
    return 1 if slower else 0
