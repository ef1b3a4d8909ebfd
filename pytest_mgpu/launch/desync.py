"""The first collective the ranks disagree on, named from their flight recorders.

A hang in a collective is almost always a disagreement: a rank-dependent branch calls another
collective (rank 1 broadcasts while the others all-gather), skips one (a rank with less data leaves the
loop early), or passes other sizes. Each rank's recorder lists the collectives it entered in this call,
numbered per process group (``flight.py``); walking the numbers in order, the first one where the ranks'
names or input sizes differ, or where some rank never arrived, is the one to report:

    collective #4: rank 1 entered broadcast, ranks 0, 2, 3 entered all_gather
    rank 3 never reached collective #7 (all_reduce) that ranks 0-2 entered; its last was #6
    collective #4: rank 2 entered all_reduce with sizes [[3]], ranks 0, 1, 3 entered all_reduce with sizes [[4]]

Ranks that are only slow (still computing, still starting) are not "never reached": they are behind,
and the report says so elsewhere. A rooted collective (scatter, gather) carries its tensor list on its root
alone, so an empty input there is not a disagreement: sizes and dtypes are compared among the ranks that
passed some. A rank with no record (it died, the recorder was off) is left out.
Plain Python; the same code reads gloo's recorder and NCCL's (the latter untested here: no GPU).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import AbstractSet, Dict, List, Optional

from .errors import ranks_words
from .flight import Collective


@dataclass
class Trace:
    """What is known of one rank's collectives in this call."""

    collectives: Optional[List[Collective]] = None  # from its recorder (raised, hung ranks)
    last: Dict[int, int] = field(default_factory=dict)  # per group: its last one (returned ranks)

    @property
    def known(self) -> bool:
        return self.collectives is not None or bool(self.last)


def first_disagreement(traces: Dict[int, Trace], behind: AbstractSet[int] = frozenset()) -> str:
    """The first collective the ranks disagree on, as a sentence; "" when they agree (or too little
    is recorded). ``behind``: ranks still computing or starting, which are slow, not desynchronized."""
    traces = {r: t for r, t in traces.items() if t.known}
    groups: Dict[int, str] = {}
    for t in traces.values():
        for c in t.collectives or ():
            groups.setdefault(c.group, c.group_name)
    for g in sorted(groups, key=lambda g: (groups[g] != "", g)):  # the default group first
        said = _in_group(g, groups[g], traces, behind)
        if said:
            return said
    return ""


def _in_group(g: int, name: str, traces: Dict[int, Trace], behind: AbstractSet[int]) -> str:
    entries = {r: {c.seq: c for c in t.collectives or () if c.group == g} for r, t in traces.items()}
    last = {r: max([t.last.get(g, 0), *entries[r]]) for r, t in traces.items()}
    # every rank belongs to the default group; of another, only the ranks seen in it are known members
    members = sorted(traces) if name == "" else sorted(r for r in traces if last[r] > 0)
    recorded = [min(entries[r]) for r in members if entries[r]]
    if len(members) < 2 or not recorded:
        return ""
    lo, hi = max(recorded), max(last[r] for r in members)
    where = f" of group {name}" if name else ""
    for k in range(min(lo, min(last[r] for r in members) + 1), hi + 1):
        present = [r for r in members if last[r] >= k]
        seen = {r: entries[r][k] for r in present if k in entries[r]}
        said = _mismatch(k, where, seen)
        if said:
            return said
        missing = [r for r in members if last[r] < k]
        if missing:  # ranks only behind (slow) are not said to have missed it
            absent = [r for r in missing if r not in behind]
            return _never_reached(k, where, absent, present, seen, last) if absent else ""
    return ""


# Collectives whose tensor list exists on the root rank only (the others pass none).
ROOTED = frozenset({"scatter", "gather"})


def _mismatch(k: int, where: str, seen: Dict[int, Collective]) -> str:
    """Ranks that entered collective #k with other names, or other sizes (dtypes) of the same name."""
    if len(seen) < 2:
        return ""
    ops = {c.op for c in seen.values()}
    if len(ops) > 1:
        return _split(k, where, {r: c.op for r, c in seen.items()})
    if ops & ROOTED:  # only the ranks that passed a tensor list can disagree on it
        seen = {r: c for r, c in seen.items() if _given(c.sizes)}
    for describe in (lambda c: f"{c.op} with sizes {_sizes(c.sizes)}",
                     lambda c: f"{c.op} with dtypes {', '.join(map(str, c.dtypes))}"):
        said = _split(k, where, {r: describe(c) for r, c in seen.items()})
        if said:
            return said
    return ""


def _split(k: int, where: str, what: Dict[int, str]) -> str:
    by: Dict[str, List[int]] = {}
    for r, w in sorted(what.items()):
        by.setdefault(w, []).append(r)
    if len(by) < 2:
        return ""
    parts = sorted(by.items(), key=lambda kv: (len(kv[1]), kv[1]))
    return f"collective #{k}{where}: " + ", ".join(f"{ranks_words(rs)} entered {w}" for w, rs in parts)


def _given(sizes) -> bool:
    """Some tensor was passed: sizes not empty (nor a list of empty lists)."""
    if isinstance(sizes, (list, tuple)):
        return any(_given(s) if isinstance(s, (list, tuple)) else True for s in sizes)
    return True


def _never_reached(k: int, where: str, absent: List[int], present: List[int], seen: Dict[int, Collective],
                   last: Dict[int, int]) -> str:
    ops = {c.op for c in seen.values()}
    what = f" ({ops.pop()})" if len(ops) == 1 else ""
    lasts = sorted({last[r] for r in absent})
    if lasts == [0]:
        theirs = "it entered none in this call" if len(absent) == 1 else "they entered none in this call"
    else:
        whose = "its" if len(absent) == 1 else "their"
        theirs = f"{whose} last was " + ", ".join(f"#{n}" for n in lasts)
    return f"{ranks_words(absent)} never reached collective #{k}{where}{what} that {ranks_words(present)} entered; {theirs}"


def _sizes(sizes) -> str:
    def plain(v):
        return [plain(x) for x in v] if isinstance(v, (list, tuple)) else v
    return str(plain(sizes)).replace(" ", "")
