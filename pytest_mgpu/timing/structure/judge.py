"""A call's structure against its golden: counts must be equal; bytes sent and peak memory may move by
the tolerance (0: exact). A difference is told per step, as a person reads it::

    structure changed in step 0 (train): all_gather_into_tensor 5 -> 10 (+5); bytes sent 14.5 MiB ->
    29.0 MiB (+100%); peak 7.52 MiB -> 7.52 MiB (same) [simulate#0 fsdp_step, rank 0 of 1024]
    If this change is intended, record it: --mgpu-save-structure

A golden of another torch version is not judged (torch changes what its wrappers issue), nor one
recorded on ranks of another device type (CUDA ranks issue collectives CPU ranks do not, such as
DTensor's RNG-state broadcast, and have a peak); no golden is "new". None of these fails a test.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import List, Literal, Optional

from ..units import fmt_size
from .figures import CallStructure, StepStructure

Status = Literal["same", "changed", "new", "other torch", "other device", "recorded"]
RECORD = "If this change is intended, record it: --mgpu-save-structure"


@dataclass
class Verdict:
    """One call's verdict; ``lines``: what changed (``changed``) or why it was not judged."""

    test: str
    call: str
    status: Status
    lines: List[str] = field(default_factory=list)
    changes: List[dict] = field(default_factory=list)  # per line of ``lines``: its numbers, for scripts

    @property
    def fails(self) -> bool:
        return self.status == "changed"

    def message(self) -> str:
        return "\n".join(self.lines + ([RECORD] if self.fails else []))

    def to_dict(self) -> dict:
        return {"test": self.test, "call": self.call, "status": self.status, "lines": list(self.lines),
                "changes": list(self.changes)}

    @classmethod
    def from_dict(cls, d: dict) -> "Verdict":
        return cls(str(d["test"]), str(d["call"]), d["status"], list(d.get("lines", [])), list(d.get("changes", [])))


def _change(old: int, new: int) -> str:
    if old == new:
        return "same"
    if old == 0:
        return "from 0"
    pct = (new - old) / old * 100
    if abs(pct) < 0.05:  # "+0.0%" would read as no change: say the bytes
        return f"{new - old:+,d} B"
    return f"{pct:+.1f}%" if abs(pct) < 10 else f"{pct:+.0f}%"


def _moved(old: Optional[int], new: Optional[int], tolerance: float) -> bool:
    if old is None or new is None:
        return False  # measured on one side only (a CPU run against a CUDA golden): nothing to judge
    return abs(new - old) > tolerance * abs(old)


def step_label(index: int, name: str) -> str:
    """``step 0 (train)`` for a marked step; ``setup`` and ``step N`` as they are named."""
    if name == "setup" or name.startswith("step "):
        return name
    return f"step {index} ({name})"


def step_diff(old: StepStructure, new: StepStructure, tolerance: float) -> Optional[str]:
    """What changed in one step, or None. Counts exactly; bytes (total and per op) and peak by tolerance."""
    ops = sorted(set(old.counts) | set(new.counts))
    counts = [f"{op} {old.counts.get(op, 0)} -> {new.counts.get(op, 0)} "
              f"({new.counts.get(op, 0) - old.counts.get(op, 0):+d})"
              for op in ops if old.counts.get(op, 0) != new.counts.get(op, 0)]
    moved_bytes = _moved(old.sent_total, new.sent_total, tolerance) or any(
        _moved(old.sent.get(op, 0), new.sent.get(op, 0), tolerance) for op in ops)
    moved_peak = _moved(old.peak_bytes, new.peak_bytes, tolerance)
    if not (counts or moved_bytes or moved_peak):
        return None
    parts = counts or ["collectives the same"]
    parts.append(f"bytes sent {fmt_size(old.sent_total)} -> {fmt_size(new.sent_total)} "
                 f"({_change(old.sent_total, new.sent_total)})")
    if old.peak_bytes is not None and new.peak_bytes is not None:
        parts.append(f"peak {fmt_size(old.peak_bytes)} -> {fmt_size(new.peak_bytes)} "
                     f"({_change(old.peak_bytes, new.peak_bytes)})")
    return "; ".join(parts)


def _ranks(ranks: List[int]) -> str:
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    if ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"ranks {ranks[0]}-{ranks[-1]}"
    return "ranks " + ", ".join(map(str, ranks))


def compare(test: str, golden: CallStructure, now: CallStructure, tolerance: float) -> Verdict:
    """``same`` or ``changed`` with one line per changed step (ranks that changed alike share a line)."""
    found: dict = {}  # (step label, what changed) -> ranks
    numbers: dict = {}  # (step label, what changed) -> the first such rank's figures before and after
    for rank in sorted(set(golden.ranks) | set(now.ranks)):
        old, new = golden.ranks.get(rank), now.ranks.get(rank)
        if old is None or new is None:
            what = "not recorded in the golden" if old is None else "not measured in this run"
            found.setdefault(("", f"rank {rank} {what}"), []).append(rank)
            continue
        if len(old) != len(new):
            found.setdefault(("", f"{len(old)} steps -> {len(new)} steps ({', '.join(s.name for s in new)})"),
                             []).append(rank)
        for i, (a, b) in enumerate(zip(old, new)):
            diff = step_diff(a, b, tolerance)
            if diff is not None:
                found.setdefault((step_label(i, b.name), diff), []).append(rank)
                numbers.setdefault((step_label(i, b.name), diff), _numbers(a, b))
    if golden.world_size != now.world_size:
        found[("", f"world size {golden.world_size} -> {now.world_size}")] = []
    lines, changes = [], []
    for (label, diff), ranks in found.items():
        where = f" in {label}" if label else ""
        whom = f", {_ranks(ranks)} of {now.world_size}" if ranks else ""
        lines.append(f"structure changed{where}: {diff} [{now.call}{whom}]")
        changes.append(dict(numbers.get((label, diff), {"what": diff}), step=label, ranks=ranks))
    return Verdict(test, now.call, "changed" if lines else "same", lines, changes)


def _numbers(old: StepStructure, new: StepStructure) -> dict:
    """A changed step's figures, golden then now: counts and bytes sent per op, the total, the peak."""
    ops = sorted(set(old.counts) | set(new.counts))
    return {"counts": {op: [old.counts.get(op, 0), new.counts.get(op, 0)] for op in ops},
            "sent": {op: [old.sent.get(op, 0), new.sent.get(op, 0)] for op in ops},
            "sent_total": [old.sent_total, new.sent_total], "peak_bytes": [old.peak_bytes, new.peak_bytes]}
