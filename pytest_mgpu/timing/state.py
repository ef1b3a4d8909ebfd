"""The timing side of one pytest process: options, the gate's verdicts, records per test id, and what
is written at the end. Kept apart from the core's session; plugin.py reaches it through the stash."""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional, Tuple

from ..environment import Fingerprint
from . import gate
from .baselines import BaselineStore, entry_from
from .measure import Measurement

GATE_MODES = ("auto", "fail", "warn")
PROPERTY = "mgpu_timing"  # user property (JSON text): the test's measurements with verdicts


class TimingOptionError(ValueError):
    pass


@dataclass(frozen=True)
class TimingOptions:
    baselines_dir: Path
    save: bool = False
    threshold: float = gate.DEFAULT_THRESHOLD  # fraction: 0.10 = 10% slower
    gate: str = "auto"  # auto: fail on real GPUs, warn on emulated CPU ranks
    report_paths: Tuple[Path, ...] = ()
    plot_dir: Optional[Path] = None

    @classmethod
    def resolve(cls, option: Callable[[str], object], ini: Callable[[str], object], rootpath: Path,
                invocation_dir: Optional[Path] = None):
        """Command line beats ini. Paths given on the command line are relative to where pytest was
        started; the baselines directory from the ini file, or by default, to the rootdir."""
        here = Path(invocation_dir) if invocation_dir is not None else Path.cwd()

        def pick(name: str):
            v = option(name)
            return v if v not in (None, "") else (ini(name) or None)

        raw = pick("mgpu_regression")
        threshold = gate.DEFAULT_THRESHOLD
        if raw is not None:
            text = str(raw).strip().rstrip("%")
            try:
                threshold = float(text) / 100.0
            except ValueError:
                raise TimingOptionError(f"--mgpu-regression takes a percentage such as 10 or 10%, got {raw!r}") from None
            if not threshold > 0:
                raise TimingOptionError(f"--mgpu-regression must be a positive percentage, got {raw!r}")
        mode = str(pick("mgpu_gate") or "auto").strip().lower()
        if mode not in GATE_MODES:
            raise TimingOptionError(f"--mgpu-gate must be one of {', '.join(GATE_MODES)}, got {mode!r}")
        if option("mgpu_baselines"):
            bdir = here / str(option("mgpu_baselines"))
        elif ini("mgpu_baselines"):
            bdir = rootpath / str(ini("mgpu_baselines"))
        else:
            bdir = rootpath / "baselines"
        raw_reports = option("mgpu_report") or []
        reports = tuple(here / str(r) for r in ([raw_reports] if isinstance(raw_reports, str) else raw_reports))
        for report in reports:
            if report.suffix.lower() not in (".md", ".json", ".csv"):
                raise TimingOptionError(f"--mgpu-report writes .md, .json or .csv (by extension), got {report}")
        plots = option("mgpu_plot")
        return cls(
            baselines_dir=bdir,
            save=bool(option("mgpu_save_baselines")),
            threshold=threshold,
            gate=mode,
            report_paths=reports,
            plot_dir=here / str(plots) if plots else None,
        )

    def mode_for(self, emulated: bool) -> str:
        """What a regression does: 'fail' or 'warn'. Emulated CPU ranks warn by default: their times
        move with whatever else shares the CPU (see README, measured false-alarm rate)."""
        if self.gate == "auto":
            return "warn" if emulated else "fail"
        return self.gate


@dataclass
class TestTiming:
    """The measurements of one test as the controller received them."""

    nodeid: str
    outcome: str
    measurements: List[dict]


@dataclass
class TimingState:
    options: TimingOptions
    fingerprint_of: Callable[[str], Fingerprint]  # device type -> this machine's fingerprint
    records: Dict[str, TestTiming] = field(default_factory=dict)
    written: List[str] = field(default_factory=list)  # lines for the terminal summary
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
    def judge(self, measurements: List[Measurement]) -> List[dict]:
        """Each measurement as plain data, with its fingerprint and the gate's verdict."""
        out = []
        for m in measurements:
            fp = self.fingerprint(m.task.device_type)
            base = self.store.lookup(fp, m.task.key)
            verdict = gate.judge(m.samples, base.samples if base else None, self.options.threshold,
                                 baseline_source=base.source if base else "")
            d = m.to_dict()
            d.update(fingerprint=fp.to_dict(), fingerprint_key=fp.key(), verdict=verdict.to_dict(),
                     gate_mode=self.options.mode_for(m.task.emulated))
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
        """(failures, warnings): regression messages, split by the gate mode of each measurement."""
        fails, warns = [], []
        for d in judged:
            v = gate.Verdict.from_dict(d["verdict"])
            if v.regression:
                msg = f"{d['key']} {v.format()}"
                (fails if d["gate_mode"] == "fail" else warns).append(msg)
        return fails, warns

    # -- in the controller --------------------------------------------------------------------------
    def collect(self, nodeid: str, outcome: str, user_properties) -> None:
        """Record a test's measurements from its call report; the same test again replaces them."""
        for name, value in user_properties:
            if name == PROPERTY:
                self.records[nodeid] = TestTiming(nodeid, outcome, json.loads(value))
                return

    def measurements(self) -> List[Tuple[TestTiming, dict]]:
        return [(rec, d) for rec in self.records.values() for d in rec.measurements]

    def save_baselines(self) -> List[str]:
        """Write the measurements of tests that passed into their fingerprints' files."""
        by_fp: Dict[str, Tuple[Fingerprint, Dict[str, dict]]] = {}
        skipped = 0
        for rec, d in self.measurements():
            if rec.outcome != "passed":
                skipped += 1
                continue
            fp = Fingerprint.from_dict(d["fingerprint"])
            by_fp.setdefault(fp.key(), (fp, {}))[1][d["key"]] = entry_from(d)
        lines = []
        for key, (fp, entries) in sorted(by_fp.items()):
            path = self.store.save(fp, entries)
            lines.append(f"baselines: {len(entries)} measurement(s) saved to {_rel(path)}")
        if skipped:
            lines.append(f"baselines: {skipped} measurement(s) of failed tests not saved")
        return lines

    def fingerprint_notes(self) -> List[str]:
        """One line per fingerprint seen: which baseline file judged it, or that none exists."""
        seen: Dict[str, Tuple[Fingerprint, int, int]] = {}
        for _, d in self.measurements():
            fp = Fingerprint.from_dict(d["fingerprint"])
            k, new, total = seen.get(d["fingerprint_key"], (fp, 0, 0))
            seen[d["fingerprint_key"]] = (fp, new + (d["verdict"]["status"] == gate.NEW), total + 1)
        lines = []
        for key, (fp, new, total) in sorted(seen.items()):
            modes = sorted({d["gate_mode"] for _, d in self.measurements() if d["fingerprint_key"] == key})
            lines.append(f"fingerprint {key}: {fp.describe()}; gate: {'/'.join(modes)}, "
                         f"threshold +{self.options.threshold * 100:g}%, alpha {gate.ALPHA:g}")
            f, source = self.store.file_for(fp)
            if f is None:
                lines.append(f"  no baseline for this fingerprint in {_rel(self.options.baselines_dir)}: "
                             f"{total} measurement(s) recorded, none judged"
                             + ("" if self.options.save else "; record them with --mgpu-save-baselines"))
            elif new:
                lines.append(f"  baseline {source}: {new} of {total} measurement(s) not in it (new)")
            else:
                lines.append(f"  baseline {source}")
        return lines


def _rel(path) -> str:
    try:
        return os.path.relpath(path)
    except ValueError:
        return str(path)
