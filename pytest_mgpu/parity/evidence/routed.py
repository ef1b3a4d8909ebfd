"""The tokens each routed module received at the first step (``record/trail.py``'s ``ROUTED`` marks: a
submodule called on a subset of the batch's tokens, as a mixture of experts calls its experts). Where
the ranks are data-parallel replicas, the tokens a module received on all ranks together are the ones
it received in the reference, as a multiset of rows, each matched up to roundoff. The first module, in
the reference's call order, that received other tokens names where the routing differs: a top-k, a
capacity or a token drop decided from the rank's tokens, or routing noise drawn per rank."""
from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from ..record.trail import FED, ROUTED
from .facts import UserFacts
from .trail import NORM, rows_apart

Row = Tuple[float, List[float]]


@dataclass(frozen=True)
class Routed:
    """A module that received other tokens: how many of the reference's reached it on no rank, how many
    of the ranks' are not the reference's, of how many each side sent it; where the loop called it."""

    name: str
    missing: int
    extra: int
    ref: int
    ranks: int
    line: str
    order: int  # its place among the reference's marks of the first step (earlier: sooner in the forward)

    def words(self) -> str:
        parts = [f"{self.missing} of the reference's {self.ref} reached it on no rank"] if self.missing else []
        parts += [f"{self.extra} of the ranks' {self.ranks} are not the reference's"] if self.extra else []
        return f"{self.name} received other tokens ({'; '.join(parts)})"


def _tokens(probes: List[Any]) -> Tuple[Dict[str, List[Row]], Dict[str, Tuple[int, str]]]:
    """Per module name, every token its routed calls received; and its first mark's place and line."""
    got: Dict[str, List[Row]] = {}
    first: Dict[str, Tuple[int, str]] = {}
    at = 0
    for p in probes:
        for m in getattr(p, "trail", None) or []:
            at += 1
            if m.key[2] == ROUTED:
                got.setdefault(m.name, []).extend(m.rows)
                first.setdefault(m.name, (at, m.line))
    return got, first


def _unmatched(ref: List[Row], mine: List[Row], eps: float = 0.0) -> Tuple[int, int]:
    """(reference tokens with no rank token equal to them up to roundoff, rank tokens left over): each
    token matched once, to one of the tokens whose norms are within ``NORM`` of its own."""
    pool = sorted(mine, key=lambda r: r[0])
    norms = [r[0] for r in pool]
    used = [False] * len(pool)
    missing = 0
    for row in ref:
        width = NORM * max(abs(row[0]), 1e-30) + 1e-30
        i = bisect_left(norms, row[0] - width)
        while i < len(pool) and norms[i] <= row[0] + width and (used[i] or rows_apart(row, pool[i], eps)):
            i += 1
        if i < len(pool) and norms[i] <= row[0] + width:
            used[i] = True
        else:
            missing += 1
    return missing, used.count(False)


def first_routed(f: UserFacts) -> Optional[Routed]:
    """The first module of the reference's forward whose tokens the ranks, together, sent otherwise; None
    where no routed call was recorded, none differs, or the ranks are not data-parallel replicas of the
    whole model (tensor parallel, layers or experts held per rank: each rank's modules see parts)."""
    if f.tensor_parallel or f.hand_sharded or f.partial_ranks or any(len(g) > 1 for g in f.data_groups) or \
            not f.ref_probes:
        return None
    ref, first = _tokens(f.ref_probes)
    if not ref:
        return None
    mine: Dict[str, List[Row]] = {}
    for probes in f.rank_probes:
        for name, rows in _tokens(probes)[0].items():
            mine.setdefault(name, []).extend(rows)
    found = []
    for name, rows in ref.items():
        if name not in mine:
            continue  # never called on the ranks' recorded calls: nothing to compare
        missing, extra = _unmatched(rows, mine[name])
        if missing or extra:
            found.append(Routed(name, missing, extra, len(rows), len(mine[name]), first[name][1], first[name][0]))
    return min(found, key=lambda r: r.order) if found else None


def routed_first(f: UserFacts, routed: Routed, mark: Any) -> bool:
    """``routed`` comes before ``mark`` (a rank's trail mark) in the reference's forward: where it is
    called earlier than the first place the trail found, or the trail's place is not among its marks."""
    if mark.key[2] == FED:
        return False
    at = 0
    for p in f.ref_probes:
        for m in getattr(p, "trail", None) or []:
            at += 1
            if m.name == mark.name and m.key[2] == mark.key[2]:
                return routed.order < at
    return True
