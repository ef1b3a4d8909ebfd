"""How an optimizer step that differs differs (test process): at the first step whose update on rank 0
is not the reference's, each tensor's update (its weights after the step less before it) against the
reference's update, as ``c`` x the reference's plus a residual. What the tensors that differ share
says which part of an optimizer computes otherwise:

- ``gradless``: they get no gradient on either side (an EMA or momentum copy, a weight set by hand);
- ``1-D`` / ``N-D``: only the vectors (biases, norm weights) or only the matrices differ while the
  others agree: weight decay or a per-layer adaptation given to or kept from one kind;
- ``uniform``: every update is one factor times the reference's, in the same direction;
- ``per-tensor``: each tensor's update a factor of its own, in the same direction (a trust ratio,
  a relative step size);
- ``""``: the direction differs (the update rule itself).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Dict, List, Tuple

from ..record.recorder import SideLog

SAME = 1e-3  # relative: an update that is the reference's (c within it of 1, residual under it)
DIRECTION = 0.05  # relative residual: an update in the reference's direction


@dataclass(frozen=True)
class Ratio:
    """A tensor's update as ``c`` x the reference's plus ``residual`` (relative), its ``dims``, and
    whether it got no gradient on either side."""

    c: float
    residual: float
    dims: int
    gradless: bool

    @property
    def same(self) -> bool:
        return abs(self.c - 1) <= SAME and self.residual <= SAME


def _delta(before, after):
    if before is None or after is None or before.shape != after.shape or not before.is_floating_point():
        return None
    return (after.double() - before.double()).reshape(-1)


def _no_grad(g) -> bool:
    return g is None or not bool(g.any())


APART = 1e-5  # relative: a weight after a step that is not the reference's (well above float32 roundoff)
SURE = 100  # x the measured roundoff (float64 shadow, float32 twin): apart beyond any tolerance a pass allows


def _apart(e) -> bool:
    """Rank 0's weight ``e`` is the reference's neither to APART nor to SURE x its measured roundoff: a
    passing check (within its tolerance, some tens of that roundoff) reads no update (the work is a failure's)."""
    noise = max((x for x in (e.floor, e.twin) if math.isfinite(x)), default=math.nan)
    return e.kind == "param" and not e.name.startswith("rank ") and e.rel > APART and \
        not (math.isfinite(noise) and e.norm_err <= SURE * noise)


def first_apart(records: List) -> int:
    """The step whose update first left some weight of rank 0 apart from the reference's (-1: none)."""
    for rec in records[1:]:
        if any(_apart(e) for e in rec.errors):
            return rec.step - 1
    return -1


def ratios(rank: SideLog, ref: SideLog, s: int) -> Dict[str, Ratio]:
    """name -> Ratio of rank 0's update at step ``s`` against the reference's, for the tensors both hold
    alike; {} where ``s`` has no next step on both sides."""
    if s < 0 or s + 1 >= min(len(rank.steps), len(ref.steps)):
        return {}
    mine_now, ref_now = rank.steps[s].params, ref.steps[s].params
    out: Dict[str, Ratio] = {}
    for name, t in ref_now.items():
        a, b = _delta(mine_now.get(name), rank.steps[s + 1].params.get(name)), _delta(t, ref.steps[s + 1].params.get(name))
        if a is None or b is None or a.shape != b.shape:
            continue
        bb, ab = float(b @ b), float(a @ b)
        if bb == 0:
            c, res = (math.inf, 1.0) if bool(a.any()) else (1.0, 0.0)
        else:
            c = ab / bb
            res = float((a - c * b).norm()) / max(float(a.norm()), abs(c) * math.sqrt(bb), 1e-300)
        gradless = _no_grad(rank.steps[s].grads.get(name)) and _no_grad(ref.steps[s].grads.get(name))
        out[name] = Ratio(c, res, t.dim(), gradless)
    return out


def shape_of(found: Dict[str, Ratio], differ: List[str]) -> Tuple[str, str]:
    """(pattern, words) for the tensors ``differ`` (those over the line), read from their ratios."""
    rs = [found[n] for n in differ if n in found]
    if not rs:
        return "", ""
    if all(r.gradless for r in rs):
        return "gradless", "none of them gets a gradient on either side: they are updated outside the optimizer"
    agree = [r for n, r in found.items() if n not in differ and r.same]
    if all(r.dims <= 1 for r in rs) and any(r.dims > 1 for r in agree):
        return "1-D", "only 1-D tensors (biases, norm weights) update otherwise; every matrix's update agrees"
    if all(r.dims > 1 for r in rs) and any(r.dims <= 1 for r in agree):
        return "N-D", "only the matrices update otherwise; every 1-D tensor's (biases, norm weights) update agrees"
    if all(r.residual <= DIRECTION and math.isfinite(r.c) for r in rs):
        cs = sorted(r.c for r in rs)
        if cs[-1] - cs[0] <= 0.02 * max(abs(cs[0]), abs(cs[-1])):
            return "uniform", f"each update is {cs[len(cs) // 2]:.4g}x the reference's, in its direction"
        return "per-tensor", (f"each tensor's update is the reference's by a factor of its own ({cs[0]:.3g}x to "
                              f"{cs[-1]:.3g}x), in its direction")
    return "", ""
