"""Baseline files: readable JSON, one per hardware fingerprint, a history of launches per measurement.

``baselines/<fingerprint key>.json`` (format 2) holds, per measurement key (``<test node id>::<name>``),
the last HISTORY launches that recorded it (when, git commit, plugin version, step median, IQR, n,
in-run reference median and workload hash, x) and the raw samples of the latest launch only. The
gate judges a launch against that history (``rule.judge_history``). Format-1 files (one launch per
key, with samples) are read as a one-launch history; the first save migrates them and keeps the old
file beside it as ``<name>.json.v1``.

A file that cannot be read (not JSON, not ours, missing fields, non-numbers) raises
``BaselineError`` saying what is wrong; the store remembers it so that it is reported once, its tests
run as if no baseline existed, and a save moves it aside as ``*.corrupt`` before writing a good one.

Several writers (xdist controllers of parallel CI jobs, a developer re-recording one test) may
update one file at once: each takes an flock on a side file, re-reads, merges and ``os.replace``-s a
temporary copy, so a reader never sees half a file and no writer drops another's launches.
"""
from __future__ import annotations

import json
import math
import os
import re
import shutil
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Tuple

from .files import locked, replace_atomically
from .fingerprint import Fingerprint
from .rule import HISTORY

FORMAT = "pytest-mgpu baselines 2"
FORMAT_1 = "pytest-mgpu baselines 1"
STRUCTURE_FILE = "structure.json"  # beside the timing files; not keyed by hardware


STALE = ("its fingerprint names the CPU model but not its generation (recorded before fingerprints carried "
         "the CPU's family/model/stepping and torch's ISA level), and one CPU name covers machines up to 2.2x "
         "apart, so it judges nothing here. Record this machine's baseline with --mgpu-save-timing, then "
         "delete the stale file")


class BaselineError(ValueError):
    """A baseline file that cannot be used; the message names the file and what is wrong."""


def utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@dataclass
class Launch:
    """One launch's figures for one measurement."""

    when: str
    median_s: float
    iqr_s: float
    n: int
    commit: Optional[str] = None
    version: Optional[str] = None
    reference_median_s: Optional[float] = None
    reference_hash: Optional[str] = None
    x: Optional[float] = None  # ln(median_s / reference_median_s)


@dataclass
class Entry:
    """A measurement's history in one file, and what the report needs to label it."""

    launches: List[Launch]
    latest_samples_s: List[float]
    info: Dict[str, object] = field(default_factory=dict)  # strategy, group, world size, batch, params

    def history(self, reference_hash: str) -> List[float]:
        """The x of launches timed against the same reference workload (others do not compare)."""
        return [ln.x for ln in self.launches if ln.reference_hash == reference_hash and ln.x is not None]

    @property
    def median_of_medians(self) -> float:
        meds = sorted(ln.median_s for ln in self.launches)
        mid = len(meds) // 2
        return meds[mid] if len(meds) % 2 else (meds[mid - 1] + meds[mid]) / 2


def _number(v, what: str, positive: bool = True) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v) or (positive and v <= 0):
        raise BaselineError(f"{what} is {v!r}, not a {'positive ' if positive else ''}finite number")
    return float(v)


def _samples(v, what: str) -> List[float]:
    if not isinstance(v, list) or not v:
        raise BaselineError(f"{what} is {json.dumps(v)[:40]}, not a list of times")
    return [_number(s, what) for s in v]


def _launch(d, what: str) -> Launch:
    if not isinstance(d, dict):
        raise BaselineError(f"{what} is not an object")
    x = d.get("x")
    return Launch(when=str(d.get("when", "?")), median_s=_number(d.get("median_s"), f"{what}: median_s"),
                  iqr_s=_number(d.get("iqr_s", 0.0), f"{what}: iqr_s", positive=False), n=int(d.get("n") or 0),
                  commit=d.get("commit"), version=d.get("version"),
                  reference_median_s=d.get("reference_median_s"), reference_hash=d.get("reference_hash"),
                  x=None if x is None else _number(x, f"{what}: x", positive=False))


INFO_KEYS = ("strategy", "group", "world_size", "batch_size", "params", "throughput", "peak_mem_bytes")


def _entry(key: str, d, fmt: str) -> Entry:
    if not isinstance(d, dict):
        raise BaselineError(f"entry {key!r} is not an object")
    info = {k: d[k] for k in INFO_KEYS if k in d}
    if fmt == FORMAT_1:  # one launch, with samples, no reference
        samples = _samples(d.get("samples_s"), f"entry {key!r}: samples_s")
        median = _number(d.get("median_s"), f"entry {key!r}: median_s")
        launch = Launch(when=str(d.get("recorded", "?")), median_s=median,
                        iqr_s=_number(d.get("iqr_s", 0.0), f"entry {key!r}: iqr_s", positive=False), n=len(samples))
        return Entry([launch], samples, info)
    launches = d.get("launches")
    if not isinstance(launches, list) or not launches:
        raise BaselineError(f"entry {key!r}: launches is {json.dumps(launches)[:40]}, not a list of launches")
    return Entry([_launch(ln, f"entry {key!r} launch {i}") for i, ln in enumerate(launches)],
                 _samples(d.get("latest_samples_s"), f"entry {key!r}: latest_samples_s"), info)


@dataclass
class BaselineFile:
    path: Path
    fingerprint: Fingerprint
    updated: str = ""
    entries: Dict[str, Entry] = field(default_factory=dict)
    format: str = FORMAT  # as read; FORMAT_1 until saved again

    def to_json(self) -> str:
        entries = {}
        for k in sorted(self.entries):
            e = self.entries[k]
            entries[k] = dict(e.info, launches=[asdict(ln) for ln in e.launches],
                              latest_samples_s=[float(f"{s:.6g}") for s in e.latest_samples_s])
        doc = {"format": FORMAT, "key": self.fingerprint.key(), "fingerprint": self.fingerprint.to_dict(),
               "updated": self.updated, "entries": entries}
        text = json.dumps(doc, indent=1)
        # one line per launch and per list of numbers, so that a file stays readable and diffable
        text = re.sub(r"\[\s+([-+0-9.eE,\s]+?)\s+\]",
                      lambda m: "[" + ", ".join(p.strip() for p in m.group(1).split(",")) + "]", text)
        return re.sub(r"\{\n\s+(\"when\"[^{}]*?)\n\s+\}",
                      lambda m: "{" + " ".join(p.strip() for p in m.group(1).split("\n")) + "}", text) + "\n"

    @classmethod
    def read(cls, path: Path) -> "BaselineFile":
        """The file at ``path``; BaselineError (naming the file and the problem) if it is not usable."""
        try:
            with open(path, encoding="utf-8") as f:
                doc = json.load(f)
        except UnicodeDecodeError:
            raise BaselineError(f"{path}: not text (binary or random bytes)") from None
        except json.JSONDecodeError as exc:
            raise BaselineError(f"{path}: not valid JSON ({exc}; truncated?)") from None
        if not isinstance(doc, dict):
            raise BaselineError(f"{path}: holds a JSON {type(doc).__name__}, not a pytest-mgpu baseline object")
        fmt = doc.get("format")
        if isinstance(fmt, str) and fmt.startswith("pytest-mgpu structure"):
            raise BaselineError(f"{path} holds structure goldens ({fmt!r}), not timings: pytest judges them "
                                "(--mgpu-structure=check); give this command a timing baseline or a "
                                "--mgpu-report JSON file")
        if fmt not in (FORMAT, FORMAT_1):
            raise BaselineError(f"{path} is not a pytest-mgpu baseline file (format {fmt!r}, expected "
                                f"{FORMAT!r}); move it out of the baselines directory")
        try:
            if not isinstance(doc.get("fingerprint"), dict) or not isinstance(doc.get("entries"), dict):
                raise BaselineError("'fingerprint' or 'entries' is missing or not an object")
            fp = Fingerprint.from_dict(doc["fingerprint"])
            entries = {str(k): _entry(k, v, fmt) for k, v in doc["entries"].items()}
        except BaselineError as exc:
            raise BaselineError(f"{path}: {exc}") from None
        except (TypeError, ValueError) as exc:
            raise BaselineError(f"{path}: {exc}") from None
        return cls(Path(path), fp, str(doc.get("updated", "")), entries, fmt)


@dataclass(frozen=True)
class Baseline:
    """One entry found for a measurement, and where it came from."""

    entry: Entry
    source: str  # file name, plus a note when recorded with other software on the same hardware


@dataclass(frozen=True)
class NewLaunch:
    """What a save appends for one measurement."""

    launch: Launch
    samples_s: List[float]
    info: Dict[str, object]
    restart: bool = False  # a new speed, recorded on purpose: the history starts again from this launch


class BaselineStore:
    """The baselines directory; read lazily, cached per process, written under a lock."""

    def __init__(self, directory):
        self.dir = Path(directory)
        self._cache: Dict[str, Optional[BaselineFile]] = {}
        self._all: Optional[List[BaselineFile]] = None
        self.problems: Dict[str, str] = {}  # path -> what is wrong with it (reported once)

    def path_for(self, fp: Fingerprint) -> Path:
        return self.dir / f"{fp.key()}.json"

    def _load(self, path: Path) -> Optional[BaselineFile]:
        key = str(path)
        if key not in self._cache:
            try:
                self._cache[key] = BaselineFile.read(path) if path.is_file() else None
            except (BaselineError, OSError) as exc:
                self.problems[key] = str(exc)
                self._cache[key] = None
        return self._cache[key]

    def _files(self) -> List[BaselineFile]:
        if self._all is None:
            self._all = []
            if self.dir.is_dir():
                for p in sorted(self.dir.glob("*.json")):
                    if p.name == STRUCTURE_FILE:
                        continue  # the structure goldens (timing.structure.golden), not timings
                    f = self._load(p)
                    if f is not None:
                        self._all.append(f)
        return self._all

    def scan(self) -> Dict[str, str]:
        """Read every file in the folder once; what is wrong with each that cannot be read."""
        self._files()
        return dict(self.problems)

    def unreadable(self, fp: Fingerprint) -> Optional[str]:
        """What is wrong with this fingerprint's own file, if it exists and cannot be read."""
        path = self.path_for(fp)
        self._load(path)
        return self.problems.get(str(path))

    def file_for(self, fp: Fingerprint) -> Tuple[Optional[BaselineFile], str]:
        """The file for ``fp``; else the newest file of the same hardware with other software (so a
        torch or CUDA upgrade is judged against the numbers before it), with a note saying so."""
        exact = self._load(self.path_for(fp))
        if exact is not None:
            return exact, exact.path.name
        if self.unreadable(fp):
            return None, ""
        kin = [f for f in self._files() if f.fingerprint.same_hardware(fp)]
        if not kin:
            return None, ""
        best = max(kin, key=lambda f: f.updated)
        return best, f"{best.path.name} (same hardware, {fp.software_diff(best.fingerprint)})"

    def lookup(self, fp: Fingerprint, key: str) -> Optional[Baseline]:
        f, source = self.file_for(fp)
        if f is None or key not in f.entries:
            return None
        return Baseline(f.entries[key], source)

    def stale_for(self, fp: Fingerprint) -> List[BaselineFile]:
        """Files keyed by an older fingerprint that names this machine's CPU model but not its
        generation (no vendor/family/model/stepping, no ISA level: format-1 files written before those were part of the key).
        They may be this machine's or another generation's, so they judge nothing; ``STALE`` says
        so instead of ignoring them in silence."""
        if not fp.emulated or (fp.cpu_id is None and fp.isa is None):
            return []
        return [f for f in self._files() if f.fingerprint.emulated and f.fingerprint.cpu_id is None
                and f.fingerprint.isa is None and (f.fingerprint.device, f.fingerprint.device_count,
                                                   f.fingerprint.backend) == (fp.device, fp.device_count, fp.backend)]

    def other_hardware(self, fp: Fingerprint) -> List[BaselineFile]:
        """Readable files of other hardware (not stale, not kin): they judge nothing here, but a
        reader who sees "no baseline" next to a committed file must be told why."""
        stale = {f.path for f in self.stale_for(fp)}
        return [f for f in self._files() if f.path != self.path_for(fp) and f.path not in stale
                and not f.fingerprint.same_hardware(fp)]

    def describe_match(self, fp: Fingerprint) -> str:
        f, source = self.file_for(fp)
        stale = "".join(f"; {s.path.name} is stale: {STALE}" for s in self.stale_for(fp))
        if f is None:
            problem = self.unreadable(fp)
            if problem:
                return f"unreadable: {problem}"
            return f"none in {self.dir} (record one with --mgpu-save-timing){stale}"
        return f"{self.dir / source} ({len(f.entries)} entries, format {f.format[-1]}){stale}"

    def save(self, fp: Fingerprint, launches: Dict[str, NewLaunch]) -> Path:
        """Append one launch per key to the file of ``fp`` (created if missing; a ``restart`` launch
        replaces its history), atomically, under a lock. A damaged file is kept aside as ``*.corrupt``;
        a format-1 file as ``*.json.v1``."""
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.path_for(fp)
        with locked(self.dir / f".{path.name}.lock"):
            doc = self._current(path, fp)
            doc.fingerprint = fp
            for key, new in launches.items():
                old = doc.entries.get(key)
                history = (old.launches if old and not new.restart else []) + [new.launch]
                doc.entries[key] = Entry(history[-HISTORY:], list(new.samples_s), dict(new.info))
            doc.updated = utc_now()
            replace_atomically(path, doc.to_json())
        self._cache[str(path)] = doc
        self.problems.pop(str(path), None)
        self._all = None
        return path

    def _current(self, path: Path, fp: Fingerprint) -> BaselineFile:
        """The file as it is now (under the lock), with damaged and format-1 files kept aside."""
        if not path.exists():
            return BaselineFile(path, fp)
        try:
            current = BaselineFile.read(path)
        except BaselineError:
            aside = path.with_name(path.name + ".corrupt")
            k = 1
            while aside.exists():
                aside, k = path.with_name(f"{path.name}.corrupt.{k}"), k + 1
            os.replace(path, aside)
            return BaselineFile(path, fp)
        if current.format == FORMAT_1 and not path.with_name(path.name + ".v1").exists():
            shutil.copy2(path, path.with_name(path.name + ".v1"))
        return current


def check_writable(directory: Path, fp_paths: List[Path]) -> Optional[str]:
    """Why baselines could not be saved in ``directory`` (None if they can): said at the start of
    the run, not as a PermissionError after every test ran."""
    d = Path(directory)
    probe = d
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        return f"{probe} is a file, not a directory"
    for p in fp_paths:
        if p.exists() and (p.is_dir() or not os.access(p, os.W_OK)):
            return f"{p} is not a writable file"
    try:
        fd, tmp = tempfile.mkstemp(prefix=".pytest-mgpu-probe.", dir=str(probe))
        os.close(fd)
        os.unlink(tmp)
    except OSError as exc:
        return f"cannot create files in {probe} ({exc.strerror or exc})"
    return None
