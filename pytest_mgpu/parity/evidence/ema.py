"""An EMA of the trained weights (a Mean Teacher, timm's ``ModelEma``, a DINO/BYOL target) read from the
fingerprints of the state no optimizer steps: where each such tensor, from one step's record to the next,
is ``m * itself + (1 - m) * the student's tensor of the same name`` with one ``m`` for all of them, that
``m`` is the step's momentum (1: not updated). Fingerprints are dot products with a fixed vector, so the
relation holds for them exactly as for the tensors (float rounding apart). Read per side and step, the
momenta say how the ranks' EMA runs against the reference's: not updated on some ranks, with a fixed
momentum where the reference's warms up, one update ahead (an update before the optimizer step), or
another momentum."""
from __future__ import annotations

import math
import statistics
from typing import Dict, List, Optional, Sequence

from ..record.prints import weights
from ..record.recorder import SideLog
from .facts import UserFacts
from .finding import Finding

SPREAD = 2e-3  # absolute: the momenta the tensors of one step give agree to this (rounding of near tensors)
SAME = 1e-3  # absolute: two sides' momenta agree
SWAPPED = "1 - the reference's"  # the words of a momentum whose two weights are swapped (table.py reads them)
Momenta = List[Optional[float]]  # per step: the momentum of the update since the previous record (None: unread)


def momenta(side: SideLog, teacher: List[Dict[str, float]], start: Dict[str, float]) -> Momenta:
    """Per step ``s``: ``m`` with ``teacher[s] = m * teacher[s - 1] + (1 - m) * student[s]`` for every tensor
    matched to a student's (``teacher[-1]``: ``start``, before the first forward); None where no one ``m``
    fits (no EMA, another rule, several updates) or the tensors tell none (a teacher equal to the student)."""
    if not side.steps or not any(teacher):
        return []
    pairs = _pairs(_held(teacher), list(side.steps[0].params))  # a copy made at a later step (SWA) too
    if len(pairs) < 2:
        return []
    out: Momenta = []
    for s, now in enumerate(teacher[:len(side.steps)]):
        before = start if s == 0 else teacher[s - 1]
        student = side.steps[s].params
        ms = []
        for t, p in pairs.items():
            x = student.get(p)
            if x is None or t not in now or t not in before or not x.is_floating_point():
                continue
            sp = float(x.detach().reshape(-1).double() @ weights(x.numel()))
            gap = before[t] - sp
            if abs(gap) > 1e-6 * max(abs(sp), abs(before[t]), 1e-12):
                ms.append((now[t] - sp) / gap)
        out.append(statistics.median(ms) if len(ms) >= 2 and max(ms) - min(ms) < SPREAD else None)
    return out


def _held(teacher: List[Dict[str, float]]) -> List[str]:
    """The names of the state no optimizer steps at any step, in the order first held."""
    return list(dict.fromkeys(n for step in teacher for n in step))


def _pairs(teacher: Sequence[str], student: Sequence[str]) -> Dict[str, str]:
    """Teacher tensor -> the student parameter its name ends with (the longest such name)."""
    names, out = set(student), {}
    for t in teacher:
        parts = t.split(".")
        found = next((".".join(parts[i:]) for i in range(len(parts)) if ".".join(parts[i:]) in names), None)
        if found is not None:
            out[t] = found
    return out


def findings(f: UserFacts) -> List[Finding]:
    found = _finding(f)
    return [found] if found is not None else []


def _finding(f: UserFacts) -> Optional[Finding]:
    return _absent(f) or _momentum(f)


def _absent(f: UserFacts) -> Optional[Finding]:
    """The first step at which some ranks run a copy, as the reference does, and another rank runs none
    (its copy never updated, so the code that would run it skipped it: an ``if rank == 0`` update)."""
    copies = set(f.copies)
    for s, step in enumerate(f.untrained):
        held = [sorted(copies & set(r)) for r in step]
        ref = f.ref_untrained[s] if s < len(f.ref_untrained) else {}
        if not any(held) or all(held) or not copies & set(ref):
            continue
        alike = [i for i, h in enumerate(held) if h]
        r = next(i for i, h in enumerate(held) if not h)
        shown = held[alike[0]][0] + (f" and {len(held[alike[0]]) - 1} more" if len(held[alike[0]]) > 1 else "")
        return Finding(s, "state", "one rank alone", "ema-rank", f"before step {s} only rank "
                       f"{', '.join(map(str, alike))} updated and ran its EMA or averaged copy of the model ({shown}), "
                       f"as the reference does; rank {r} ran none", names=(str(r),))
    return None


def _momentum(f: UserFacts) -> Optional[Finding]:
    ref = f.ref_ema
    if not f.rank_ema or not ref:
        return None
    for s in range(len(ref)):
        per_rank = [m[s] if s < len(m) else None for m in f.rank_ema]
        if ref[s] is None or any(m is None for m in per_rank):
            continue
        off = [r for r, m in enumerate(per_rank) if abs(m - ref[s]) > SAME]  # type: ignore[operator]
        if not off:
            continue
        return _said(f, s, per_rank, off)
    return None


def _said(f: UserFacts, s: int, per_rank: List[Optional[float]], off: List[int]) -> Finding:
    ref, r = f.ref_ema, off[0]
    mine = f.rank_ema[r]
    head = f"before step {s} the EMA's momentum was {_shown(mine, s)} on rank {r}, {_shown(ref, s)} in the reference"
    alike = [i for i in range(len(per_rank)) if i not in off]
    if alike and all(m is not None and abs(m - 1) < SAME for m in mine[s:]):
        moved = ", ".join(map(str, alike))
        return Finding(s, "state", "one rank alone", "ema-rank", f"before step {s} only rank {moved} updated its EMA "
                       f"copy (momentum {per_rank[alike[0]]:.4g}, as the reference's); rank {r}'s did not move "
                       "(momentum 1)", names=(str(r),))
    later = [(a, b) for a, b in zip(mine[s:], ref[s + 1:]) if a is not None and b is not None]
    if len(later) >= 2 and all(abs(a - b) <= SAME for a, b in later):
        return Finding(s, "state", "a value", "ema-ahead", head + ": the ranks' runs one update ahead")
    fixed, theirs = [m for m in mine[s:] if m is not None], [m for m in ref[s:] if m is not None]
    if len(fixed) >= 2 and max(fixed) - min(fixed) <= SAME and len(theirs) >= 2 and max(theirs) - min(theirs) > SAME:
        return Finding(s, "state", "a value", "ema-warm-up", head + ": the ranks' is fixed, the reference's changes")
    m, other = mine[s], ref[s]
    swapped = m is not None and other is not None and abs(m + other - 1) <= SAME and abs(m - other) > 0.05
    return Finding(s, "state", "one rank alone" if alike else "a value", "ema-momentum",
                   head + (f": the ranks' {m:.4g} is {SWAPPED} {other:.4g}" if swapped else ""),
                   names=(str(r),) if alike else ())


def _shown(ms: Momenta, s: int) -> str:
    return ", ".join("?" if m is None else f"{m:.4g}" for m in ms[s:s + 4]) + (", ..." if len(ms) > s + 4 else "")


def side_momenta(f: UserFacts, ranks: List[SideLog], ref: SideLog) -> None:
    """Fill ``f.rank_ema`` and ``f.ref_ema`` from the sides' records (the test process)."""
    f.rank_ema = [momenta(side, [step[r] if r < len(step) else {} for step in f.untrained],
                          f.rank_start[r] if r < len(f.rank_start) else {}) for r, side in enumerate(ranks)]
    f.ref_ema = momenta(ref, f.ref_untrained, f.ref_start)
    sides = [(ref, f.ref_untrained)] + ([(ranks[0], [step[0] for step in f.untrained if step])] if ranks else [])
    f.copies = sorted({t for side, held in sides if side.steps and any(held)
                       for t in _pairs(_held(held), list(side.steps[0].params))})
