"""Phase 6, the update: with the same gradients, the weights after the step differ, between ranks
(one rank's update) or from the reference's (the optimizer steps otherwise), and weights that never
move."""
from __future__ import annotations

import math
from typing import List, Optional

from .facts import UserFacts
from .finding import Finding, Report, over, plain_name, replica_of
from .update_shape import shape_of


def findings(report: Report, f: UserFacts) -> List[Finding]:
    out = [_frozen(f), _after(report, f)]
    return [x for x in out if x is not None]


def _after(report: Report, f: UserFacts) -> Optional[Finding]:
    """The first step whose update made the weights differ (seen before the next step)."""
    for step in range(1, len(report.records)):
        rank_apart = over(report, step, "param", replicas=True)
        other = over(report, step, "param", replicas=False)
        if not (rank_apart or other):
            continue
        if over(report, step - 1, "param"):
            return None  # they differed before: the state is the evidence
        if rank_apart and not f.tensor_parallel:
            ranks = sorted({r for e in rank_apart if (r := replica_of(e)) is not None})
            worst = max(rank_apart, key=lambda e: e.rel)
            same = "" if over(report, step - 1, "grad", replicas=True) else \
                ", though their gradients agreed"
            return Finding(step - 1, "update", "one rank alone", "update-rank",
                           f"the weights before step {step} differ between ranks (rank {', '.join(map(str, ranks))} vs "
                           f"rank 0: {len(rank_apart)} tensor(s), e.g. {plain_name(worst)} {worst.rel:.3g} rel), while "
                           f"up to step {step - 1} they agreed{same}", names=tuple(map(str, ranks)))
        if other and not over(report, step - 1, "grad"):
            worst = max(other, key=lambda e: e.rel)
            seen = any(e.kind == "grad" for e in report.records[step - 1].errors)
            at, found = f.update_ratios
            kind, words = shape_of(found, [e.name for e in other]) if at == step - 1 else ("", "")
            return Finding(step - 1, "update", "all tensors", "update-other" if seen else "update-inside",
                           f"with the same weights{' and gradients' if seen else ''} at step {step - 1}"
                           f"{'' if seen else ' (its gradients not compared: reference_fn keeps them elsewhere)'}, "
                           f"the weights after it differ from the reference's ({len(other)} tensor(s), e.g. "
                           f"{worst.name} {worst.rel:.3g} rel){'; ' + words if words else ''}",
                           names=(kind,) if kind else (), value=_factor(found, other) if kind == "uniform" else math.nan)
        return None
    return None


def _factor(found, other) -> float:
    cs = sorted(found[e.name].c for e in other if e.name in found)
    return cs[len(cs) // 2] if cs else math.nan


def _frozen(f: UserFacts) -> Optional[Finding]:
    sides = [who for who in sorted(f.frozen) if who not in f.foreign]
    if not sides:
        return None
    who = sides[0]
    return Finding(0, "update", "all tensors", "update-frozen",
                   f"{who}'s parameters never moved over its {f.frozen[who]} step(s) although their gradients are nonzero")
