"""Rows fed on no rank, read again: where each of the ranks' rows that is not the reference's lies near
one that is (most of its sampled values equal, or a small distance against the distance between the
reference's own rows), the ranks fed the reference's rows transformed otherwise (a random mask, noise,
mixing weights or an augmentation drawn per rank), not another batch. Read from the first step's
sampled input rows (``record/trail.py``: the first mark of each probed call)."""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from ..record.trail import FED
from .facts import UserFacts

NEAR = 0.5  # a row within half the distance from a reference row to the nearest other is near it
SPREAD = 64  # rows the median distance between the reference's rows is read from (pairs grow as its square)
EQUAL = 1e-6  # relative: a sampled value that is the reference's


@dataclass(frozen=True)
class Near:
    """``near`` of the ``of`` ranks' rows not in the reference's batch lie near one of its rows; ``equal``:
    the share of their sampled values equal to that row's; ``ratio``: their median distance against the
    median between the reference's rows."""

    near: int
    of: int
    equal: float
    ratio: float
    exact: Tuple[int, ...] = ()  # ranks whose rows are all the reference's (the others' are not)

    def words(self) -> str:
        same = f"{self.equal:.0%} of sampled values equal" if self.equal >= 0.05 else \
            f"{self.ratio:.2g}x the distance between its rows"
        exact = f"; rank {', '.join(map(str, self.exact))}'s all the reference's" if self.exact else ""
        return f"{self.near} of the {self.of} fed instead near one ({same}{exact})"


def _fed(probes: List[Any]) -> Dict[str, Tuple[float, List[float]]]:
    out: Dict[str, Tuple[float, List[float]]] = {}
    for p in probes:
        trail = getattr(p, "trail", None)
        if not trail or trail[0].key[2] != FED or len(trail[0].rows) != len(p.rows):
            continue
        for r, mark in zip(p.rows, trail[0].rows):
            out[f"{r:.12g}"] = mark
    return out


def _distance(a: List[float], b: List[float]) -> float:
    d = math.sqrt(sum((x - y) ** 2 for x, y in zip(a, b)))
    return d / max(math.sqrt(sum(x * x for x in a)), math.sqrt(sum(y * y for y in b)), 1e-30)


def _equal(a: List[float], b: List[float]) -> float:
    return sum(1 for x, y in zip(a, b) if abs(x - y) <= EQUAL * max(abs(x), abs(y), 1e-30)) / max(len(a), 1)


def near_rows(f: UserFacts) -> Optional[Near]:
    """At the first step: the ranks' rows not in the reference's batch, against the reference's rows on no
    rank; None where too few were sampled, or fewer than half of them lie near one."""
    ref = _fed(f.ref_probes)
    mine: Dict[str, Tuple[float, List[float]]] = {}
    exact = []
    for rank, probes in enumerate(f.rank_probes):
        fed = _fed(probes)
        mine.update(fed)
        if fed and all(k in ref for k in fed):
            exact.append(rank)
    missing = [v[1] for k, v in ref.items() if k not in mine]
    extra = [v[1] for k, v in mine.items() if k not in ref]
    rows = [v[1] for v in ref.values()]
    if len(missing) < 1 or len(extra) < 1 or len(rows) < 3 or any(len(v) != len(rows[0]) for v in missing + extra):
        return None
    few = rows[:SPREAD]  # the median distance between the reference's rows, from its first rows: words only
    spread = statistics.median(_distance(a, b) for i, a in enumerate(few) for b in few[i + 1:])
    if spread <= 0:
        return None
    found = []
    for row in extra:
        d, best = min(((_distance(row, m), m) for m in missing), key=lambda t: t[0])
        e = _equal(row, best)
        others = [r for r in rows if r is not best]
        apart = min(_distance(best, r) for r in others)  # how near the reference's own rows come to it
        alike = max(_equal(best, r) for r in others)
        if d < NEAR * apart or (e >= 0.5 and e >= alike + 0.2):
            found.append((d, e))
    if not found or 2 * len(found) < len(extra):
        return None
    return Near(len(found), len(extra), statistics.median(e for _, e in found),
                statistics.median(d for d, _ in found) / spread, tuple(exact))
