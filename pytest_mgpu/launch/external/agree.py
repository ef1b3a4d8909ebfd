"""How the ranks of a launched job agree: each test phase's outcome (a failure or skip on one rank
becomes the outcome on all) and what they collected.

Every rank runs the same tests in the same order, so the ranks only need to agree at a few points.
The records here are plain data that cross the job's store (``control.py``); merging them is pure,
so that every rank, given the same records, reaches the same verdict. Plain Python, no pytest.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Tuple

from ..control import Post, WorldBroken

START = "the start of "  # the tag a rank posts as it enters a dist.run
TEXT_LIMIT = 20000  # the most of a failure's text (and of its captured output) a record carries


@dataclass
class PhaseRecord:
    """One rank's outcome of one test phase (setup, call, teardown), as plain data."""

    outcome: str  # passed | failed | skipped
    text: str = ""  # the failure as pytest prints it
    crash: str = ""  # one line: the exception
    skip: Optional[Tuple[str, Optional[int], str]] = None  # pytest's (path, lineno, "Skipped: why")
    wasxfail: Optional[str] = None
    output: str = ""  # what the failing phase captured (stdout, stderr, log)


@dataclass
class Verdict:
    """What this rank's report becomes so that every rank reports the same outcome."""

    outcome: str
    message: str = ""  # the failure text, for a rank whose own phase passed or skipped
    skip: Optional[Tuple[str, Optional[int], str]] = None
    wasxfail: Optional[str] = None
    sections: List[Tuple[str, str]] = field(default_factory=list)  # other ranks' failures
    broken: bool = False  # the job ends after this test


def merge(rank: int, records: Mapping[int, PhaseRecord], when: str) -> Verdict:
    """Failed anywhere beats skipped anywhere beats passed; a failure names its ranks and keeps their text."""
    mine = records[rank]
    world = len(records)
    failed = sorted(r for r, x in records.items() if x.outcome == "failed")
    skipped = sorted(r for r, x in records.items() if x.outcome == "skipped")
    if failed:
        seen = {mine.text} if mine.outcome == "failed" else set()
        sections = []
        message = ""
        if mine.outcome != "failed":
            first = records[failed[0]]
            seen.add(first.text)
            message = (f"{when} failed on rank(s) {_names(failed)} of {world} ({mine.outcome} here, on rank {rank}): "
                       f"{first.crash}\n\n--- rank {failed[0]} ---\n{first.text}{first.output}")
        for r in failed:
            x = records[r]
            if r == rank or (message and r == failed[0]):
                continue
            if x.text not in seen:
                seen.add(x.text)
                sections.append((f"mgpu: {when} failed on rank {r}", x.text + x.output))
            elif x.output:
                sections.append((f"mgpu: what rank {r} captured ({when})", x.output))
        return Verdict("failed", message=message, sections=sections)
    if skipped and len(skipped) < world:
        src = records[skipped[0]]
        path, line, why = src.skip or ("", None, "Skipped: ")
        why = why[len("Skipped: "):] if why.startswith("Skipped: ") else why
        return Verdict("skipped", skip=(path, line, f"Skipped: on rank(s) {_names(skipped)} of {world}: {why}"),
                       wasxfail=src.wasxfail)
    return Verdict(mine.outcome, skip=mine.skip, wasxfail=mine.wasxfail)


def broken_verdict(wb: WorldBroken, where: str) -> Verdict:
    head = (f"the job was aborted by another rank during {where}: {wb.reason}" if wb.by_peer
            else f"the job ends at {where}: {wb.reason}")
    parts = [head]
    for r in sorted(wb.stacks):
        parts.append(f"\n--- rank {r}: Python stack ---\n{wb.stacks[r]}")
    return Verdict("failed", message="\n".join(parts), sections=[("mgpu: job aborted", head)], broken=True)


def _names(ranks) -> str:
    return ", ".join(map(str, ranks))



def collection_difference(counts: Dict[int, Post], lists: Dict[int, Post]) -> str:
    groups: Dict[tuple, List[int]] = {}
    for r, p in sorted(counts.items()):
        groups.setdefault(p.data, []).append(r)
    lines = ["the ranks collected different tests; every rank must collect the same tests in the same order:"]
    for (n, digest, errors), ranks in groups.items():
        lines.append(f"  rank(s) {_names(ranks)}: {n} test(s), {errors} collection error(s) (digest {digest})")
    ref = lists[0].data
    for r in sorted(lists):
        other = lists[r].data
        if other == ref:
            continue
        i = next((k for k, (a, b) in enumerate(zip(ref, other)) if a != b), min(len(ref), len(other)))
        a = ref[i] if i < len(ref) else "(end)"
        b = other[i] if i < len(other) else "(end)"
        lines.append(f"  first difference, position {i}: rank 0 has {a}, rank {r} has {b}")
    lines.append("Run the same command with the same files on every node; drop rank-dependent collection "
                 "(a conftest that reads RANK, random test order without a fixed seed, --lf/--ff with "
                 "per-node caches).")
    return "\n".join(lines)

