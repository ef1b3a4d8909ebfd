"""The timing side of one pytest process: the gate's verdicts, records per test id, and what is
written at the end (its options are ``settings.TimingSettings``). Kept apart from the core's
session; ``timing.plugin`` holds it."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Literal, Optional, Tuple

from ..settings import TimingSettings
from . import rule
from .baselines import STALE, BaselineStore, Launch, NewLaunch, utc_now
from .fingerprint import Fingerprint
from .load import RunnerLoad, probe
from .measure import Measurement
from .pairing import RevisionStatus
from .stats import mann_whitney

Outcome = Literal["passed", "failed", "skipped"]  # a test report's outcome

PROPERTY = "mgpu_timing"  # user property (JSON text): the test's measurements with verdicts


@dataclass
class TestTiming:
    """The measurements of one test as the controller received them."""

    nodeid: str
    outcome: Outcome  # the test's call phase
    measurements: List[dict]


@dataclass
class TimingState:
    options: TimingSettings
    fingerprint_of: Callable[[str], Fingerprint]  # device type -> this machine's fingerprint
    shared_cores: bool = False  # under xdist: tests run at once and time each other's load
    load_probe: Callable[[], Optional[RunnerLoad]] = probe  # read for a noisy verdict's words only
    records: Dict[str, TestTiming] = field(default_factory=dict)
    _fps: Dict[str, Fingerprint] = field(default_factory=dict)
    _store: Optional[BaselineStore] = None

    @property
    def store(self) -> BaselineStore:
        if self._store is None:
            self._store = BaselineStore(self.options.baselines_dir)
        return self._store

    def fingerprint(self, device_type: str) -> Fingerprint:
        if device_type not in self._fps:
            self._fps[device_type] = self.fingerprint_of(device_type)
        return self._fps[device_type]

    # -- in the process that ran the test (an xdist worker, or the only one) ------------------------
    def verdict(self, m: Measurement) -> Tuple[rule.HistoryVerdict, str, Optional[float]]:
        """(verdict, baseline source, Mann-Whitney p vs the latest recorded launch: information only).
        A flagged measurement is re-measured once here (``Measurement.remeasure``) and judged on both."""
        thr = self.options.threshold
        fp = self.fingerprint(m.task.device_type)
        if m.lane_only:  # the revision lane judged it from its pairs: no history verdict, never saved
            return rule.HistoryVerdict(rule.Status.NEW, None, 0, thr), "", None
        if self.store.unreadable(fp):  # first: it concerns every measurement of this fingerprint
            return rule.HistoryVerdict(rule.Status.UNREADABLE, m.x, 0, thr), "", None
        base = self.store.lookup(fp, m.task.key)
        history = base.entry.history(m.reference_hash) if base else []
        v = rule.decide(m.x, history, thr, m.unstable)
        if v.flagged and m.remeasure is not None:
            again = m.remeasure()
            m.remeasured = again.remeasured
            v = rule.decide(m.x, history, thr, m.unstable, x_again=again.x)
        p = None
        if base is not None:
            p = mann_whitney(m.samples, base.entry.latest_samples_s).p_greater
        return v, (base.source if base else ""), p

    def judge(self, measurements: List[Measurement]) -> List[dict]:
        """Each measurement as plain data, with its fingerprint and the gate's verdict (and, for a noisy
        one, the runner's load as ``load_probe`` reads it)."""
        out = []
        seen: Dict[str, Optional[RunnerLoad]] = {}
        for m in measurements:
            fp = self.fingerprint(m.task.device_type)
            v, source, p = self.verdict(m)
            d = m.to_dict()
            d.update(fingerprint=fp.to_dict(), fingerprint_key=fp.key(), verdict=v.to_dict(),
                     baseline_source=source, mann_whitney_p=p, gate_mode=self.options.mode_for(self.shared_cores),
                     saving=self.options.save)
            base = self.store.lookup(fp, m.task.key)
            d["history_median_s"] = base.entry.median_of_medians if base else None
            if v.status == rule.Status.NOISY:
                if "load" not in seen:  # read once per test, for its noisy measurements only
                    seen["load"] = self.load_probe()
                d["runner_load"] = seen["load"].describe() if seen["load"] is not None else None  # None: unread
            out.append(d)
        return out

    @staticmethod
    def properties(judged: List[dict]) -> List[Tuple[str, object]]:
        """user_properties for the test's report (also junit XML): all data as one JSON property,
        plus a readable median per measurement."""
        props: List[Tuple[str, object]] = [(PROPERTY, json.dumps(judged, separators=(",", ":")))]
        for d in judged:
            props.append((f"mgpu_median_s[{d['task']['name']}]", float(f"{d['median_s']:.6g}")))
        return props

    @staticmethod
    def problems(judged: List[dict]) -> Tuple[List[str], List[str]]:
        """(failures, warnings): regression messages by gate mode. Only a launch the gate judged slower
        (the history could see the change, and the re-measurement agreed) or the revision lane found
        slower is either: a learning, noisy or unstable row is told in the report (``noisy_lines``),
        never warned, since a warning that fires on unchanged code as on a slower one tells nothing."""
        from .messages import describe, revision_line

        fails: List[str] = []
        warns: List[str] = []
        for d in judged:
            r = d.get("revision")
            if r and r["verdict"]["status"] == RevisionStatus.SLOWER.value:
                (fails if d["gate_mode"] == "fail" else warns).append(f"{d['key']} {revision_line(r)}")
            v = rule.HistoryVerdict.from_dict(d["verdict"])
            if v.status == rule.Status.SLOWER:
                (fails if d["gate_mode"] == "fail" else warns).append(f"{d['key']} {describe(d)}")
        return fails, warns

    # -- in the controller --------------------------------------------------------------------------
    def collect(self, nodeid: str, outcome: Outcome, user_properties) -> None:
        """Record a test's measurements from its call report; the same test again replaces them."""
        for name, value in user_properties:
            if name == PROPERTY:
                self.records[nodeid] = TestTiming(nodeid, outcome, json.loads(value))
                return

    def measurements(self) -> List[Tuple[TestTiming, dict]]:
        return [(rec, d) for rec in self.records.values() for d in rec.measurements]

    def save_baselines(self, commit: Optional[str], version: str) -> List[str]:
        """Append this launch to the histories of measurements of tests that passed; never an
        unstable one's, nor a noisy one's unless its history is merely short (``rule.saves``)."""
        by_fp: Dict[str, Tuple[Fingerprint, Dict[str, NewLaunch]]] = {}
        failed = unstable = noisy = lane = 0
        for rec, d in self.measurements():
            if d.get("lane_only"):
                lane += 1
            elif rec.outcome != "passed":
                failed += 1
            elif d.get("unstable"):
                unstable += 1
            elif d.get("verdict") and not rule.saves(rule.HistoryVerdict.from_dict(d["verdict"]),
                                                     d.get("runner_load") or ""):
                noisy += 1
            else:
                fp = Fingerprint.from_dict(d["fingerprint"])
                by_fp.setdefault(fp.key(), (fp, {}))[1][d["key"]] = new_launch(d, commit, version)
        lines = []
        for key, (fp, launches) in sorted(by_fp.items()):
            path = self.store.save(fp, launches)
            lines.append(f"baselines: {len(launches)} measurement(s) appended to their histories in {_rel(path)}"
                         if not any(n.restart for n in launches.values()) else
                         f"baselines: {len(launches)} measurement(s) recorded in {_rel(path)}")
            restarted = sorted(k for k, n in launches.items() if n.restart)
            if restarted:
                lines.append(f"baselines: {len(restarted)} of them at a new speed (slower or faster than their "
                             f"history): not appended, their histories start again from this launch: "
                             f"{', '.join(restarted[:3])}" + (" ..." if len(restarted) > 3 else ""))
        if failed:
            lines.append(f"baselines: {failed} measurement(s) of failed tests not saved")
        if unstable:
            lines.append(f"baselines: {unstable} unstable measurement(s) not saved")
        if noisy:
            lines.append(f"baselines: {noisy} noisy measurement(s) not saved (their history could not judge them)")
        if lane:
            lines.append(f"baselines: {lane} measurement(s) of the revision lane not saved (its pairs judged them; "
                         "a history is recorded without --mgpu-against)")
        return lines

    def fingerprint_notes(self) -> List[str]:
        """One line per fingerprint seen: which baseline file judged it, or that none exists; and
        every unreadable baseline file, once."""
        seen: Dict[str, Tuple[Fingerprint, int]] = {}
        for _, d in self.measurements():
            fp, total = seen.get(d["fingerprint_key"], (Fingerprint.from_dict(d["fingerprint"]), 0))
            seen[d["fingerprint_key"]] = (fp, total + 1)
        lines = []
        for key, (fp, total) in sorted(seen.items()):
            lines.append(f"fingerprint {key}: {fp.describe()}")
            f, source = self.store.file_for(fp)
            if f is None and not self.store.unreadable(fp):
                lines.append(f"  no baseline for this fingerprint in {_rel(self.options.baselines_dir)}: "
                             f"{total} measurement(s) recorded, none judged"
                             + ("" if self.options.save else "; record them with --mgpu-save-timing"))
            elif f is not None:
                lines.append(f"  baseline {source}; the gate decides from {rule.MIN_HISTORY} launches, "
                             f"threshold +{self.options.threshold * 100:g}%, alpha {rule.ALPHA:g} per stage")
            for stale in self.store.stale_for(fp):
                lines.append(f"  {_rel(stale.path)} is stale: {STALE}")
            if f is None:
                for other in self.store.other_hardware(fp):
                    lines.append(f"  {_rel(other.path)} is another machine's ({other.fingerprint.describe()}): "
                                 "timings of other hardware judge nothing here")
        own = {str(self.store.path_for(fp)) for fp, _ in seen.values()}
        for path, problem in sorted(self.store.scan().items()):
            if path in own:
                lines.append(f"baseline file unreadable: {problem}. Its tests were measured as if no baseline "
                             "existed; --mgpu-save-timing keeps it aside as *.corrupt and writes a good one")
            else:  # another machine's file, or a stray one: nothing of this run was judged by it
                lines.append(f"baseline file unreadable: {problem}. It is not this run's baseline (another "
                             "machine's, or a stray file): nothing was judged by it; repair or remove it")
        return lines


def new_launch(d: dict, commit: Optional[str], version: str) -> NewLaunch:
    """What a baseline keeps of a judged measurement dict: this launch's figures, the samples of the
    latest launch, and the labels the report needs. A launch judged slower or faster than its history
    is a new speed (recorded on purpose): its history starts again from it, since one launch appended
    to the old speed's would only widen the history into ``noisy``."""
    t = d["task"]
    launch = Launch(when=utc_now(), median_s=d["median_s"], iqr_s=d["iqr_s"], n=len(d["samples_s"]),
                    commit=commit, version=version, reference_median_s=d.get("reference_median_s"),
                    reference_hash=d.get("reference_hash") or None, x=d.get("x"))
    info = {"strategy": t["strategy"], "group": t["group"], "world_size": t["world_size"],
            "batch_size": t.get("batch_size"), "params": t.get("params", {})}
    shifted = (d.get("verdict") or {}).get("status") in (rule.Status.SLOWER.value, rule.Status.FASTER.value)
    return NewLaunch(launch, list(d["samples_s"]), info, restart=shifted)


def _rel(path) -> str:
    try:
        return os.path.relpath(path)
    except ValueError:
        return str(path)
