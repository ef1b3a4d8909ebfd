"""Baseline files: readable JSON, one per hardware fingerprint, merged and replaced atomically.

``baselines/<fingerprint key>.json`` holds, per measurement key (``<test node id>::<name>``), the
samples and summary figures of the run that recorded it. Several writers (xdist controllers of
parallel CI jobs, a developer re-recording one test) may update one file at once: each takes an
flock on a side file, re-reads, merges its entries and ``os.replace``-s a temporary copy, so a
reader never sees half a file and no writer drops another's entries.
"""
from __future__ import annotations

import fcntl
import json
import os
import re
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, List, Optional, Tuple

from ..environment import Fingerprint

FORMAT = "pytest-mgpu baselines 1"


def utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


@dataclass
class BaselineFile:
    path: Path
    fingerprint: Fingerprint
    updated: str = ""
    entries: Dict[str, dict] = field(default_factory=dict)

    def to_json(self) -> str:
        doc = {
            "format": FORMAT,
            "key": self.fingerprint.key(),
            "fingerprint": self.fingerprint.to_dict(),
            "updated": self.updated,
            "entries": {k: self.entries[k] for k in sorted(self.entries)},
        }
        text = json.dumps(doc, indent=2, sort_keys=False)
        # one line per list of numbers (samples), so that a file stays readable and diffable
        return re.sub(r"\[\s+([-+0-9.eE,\s]+?)\s+\]",
                      lambda m: "[" + ", ".join(p.strip() for p in m.group(1).split(",")) + "]", text) + "\n"

    @classmethod
    def read(cls, path: Path) -> "BaselineFile":
        with open(path) as f:
            doc = json.load(f)
        if doc.get("format") != FORMAT:
            raise ValueError(f"{path} is not a pytest-mgpu baseline file (format {doc.get('format')!r}, "
                             f"expected {FORMAT!r}); move it out of the baselines directory")
        return cls(Path(path), Fingerprint.from_dict(doc["fingerprint"]), doc.get("updated", ""),
                   dict(doc.get("entries", {})))


@dataclass(frozen=True)
class Baseline:
    """One entry found for a measurement, and where it came from."""

    entry: dict
    source: str  # file name, plus a note when recorded with other software on the same hardware

    @property
    def samples(self) -> List[float]:
        return list(self.entry.get("samples_s", []))


class BaselineStore:
    """The baselines directory; read lazily, cached per process, written under a lock."""

    def __init__(self, directory):
        self.dir = Path(directory)
        self._cache: Dict[str, Optional[BaselineFile]] = {}
        self._all: Optional[List[BaselineFile]] = None

    def path_for(self, fp: Fingerprint) -> Path:
        return self.dir / f"{fp.key()}.json"

    def _load(self, path: Path) -> Optional[BaselineFile]:
        key = str(path)
        if key not in self._cache:
            self._cache[key] = BaselineFile.read(path) if path.exists() else None
        return self._cache[key]

    def _files(self) -> List[BaselineFile]:
        if self._all is None:
            self._all = []
            if self.dir.is_dir():
                for p in sorted(self.dir.glob("*.json")):
                    try:
                        f = self._load(p)
                    except (ValueError, KeyError, TypeError, json.JSONDecodeError):
                        continue  # not ours, or damaged: lookups skip it, writes replace it
                    if f is not None:
                        self._all.append(f)
        return self._all

    def file_for(self, fp: Fingerprint) -> Tuple[Optional[BaselineFile], str]:
        """The file for ``fp``; else the newest file of the same hardware with other software (so a
        torch or CUDA upgrade is judged against the numbers before it), with a note saying so."""
        exact = self._load(self.path_for(fp))
        if exact is not None:
            return exact, exact.path.name
        kin = [f for f in self._files() if f.fingerprint.same_hardware(fp)]
        if not kin:
            return None, ""
        best = max(kin, key=lambda f: f.updated)
        return best, f"{best.path.name} (same hardware, {fp.software_diff(best.fingerprint)})"

    def lookup(self, fp: Fingerprint, key: str) -> Optional[Baseline]:
        f, source = self.file_for(fp)
        if f is None or key not in f.entries:
            return None
        return Baseline(f.entries[key], f"{source}, recorded {f.entries[key].get('recorded', '?')}")

    def describe_match(self, fp: Fingerprint) -> str:
        f, source = self.file_for(fp)
        if f is None:
            return f"none in {self.dir} (record one with --mgpu-save-baselines)"
        return f"{self.dir / source} ({len(f.entries)} entries)"

    def save(self, fp: Fingerprint, entries: Dict[str, dict], remove: Iterable[str] = ()) -> Path:
        """Merge ``entries`` into the file of ``fp`` (created if missing), atomically, under a lock."""
        self.dir.mkdir(parents=True, exist_ok=True)
        path = self.path_for(fp)
        lock_fd = os.open(str(self.dir / f".{path.name}.lock"), os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(lock_fd, fcntl.LOCK_EX)
            try:
                current = BaselineFile.read(path) if path.exists() else None
            except (ValueError, KeyError, TypeError, json.JSONDecodeError):
                current = None  # damaged: replaced by this run's figures
            doc = current or BaselineFile(path, fp)
            doc.fingerprint = fp
            for k in remove:
                doc.entries.pop(k, None)
            doc.entries.update(entries)
            doc.updated = utc_now()
            fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=str(self.dir))
            try:
                with os.fdopen(fd, "w") as f:
                    f.write(doc.to_json())
                    f.flush()
                    os.fsync(f.fileno())
                os.chmod(tmp, 0o644)
                os.replace(tmp, path)
            except BaseException:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
                raise
        finally:
            fcntl.flock(lock_fd, fcntl.LOCK_UN)
            os.close(lock_fd)
        self._cache[str(path)] = doc
        self._all = None
        return path


def entry_from(measurement: dict) -> dict:
    """What a baseline keeps of a measurement dict (``Measurement.to_dict()``): enough to judge
    against and to read by eye."""
    task = measurement["task"]
    return {
        "median_s": measurement["median_s"],
        "iqr_s": measurement["iqr_s"],
        "n": len(measurement["samples_s"]),
        "samples_s": [float(f"{s:.6g}") for s in measurement["samples_s"]],
        "throughput": measurement.get("throughput"),
        "strategy": task["strategy"],
        "group": task["group"],
        "world_size": task["world_size"],
        "batch_size": task.get("batch_size"),
        "params": task.get("params", {}),
        "peak_mem_bytes": measurement.get("peak_mem_bytes"),
        "recorded": utc_now(),
    }
