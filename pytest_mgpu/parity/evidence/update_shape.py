"""How an optimizer step that differs differs (test process): at the first step whose update on rank 0
is not the reference's, each tensor's update (its weights after the step less before it) against the
reference's update, as ``c`` x the reference's plus a residual. What the tensors that differ share
says which part of an optimizer computes otherwise:

- ``gradless``: they get no gradient on either side (an EMA or momentum copy, a weight set by hand);
- ``placed``: a tensor's weights after the step are another tensor's of the reference (same shape): a
  result gathered, broadcast or copied into another tensor's place;
- ``1-D`` / ``N-D``: only the vectors (biases, norm weights) or only the matrices differ while the
  others agree: weight decay or a per-layer adaptation given to or kept from one kind;
- ``N-D-rule``: only the matrices differ, in another direction, and not by a multiple of their weights
  (no weight decay): the matrices' own update rule (momentum, orthogonalisation, preconditioning);
- ``uniform``: every update is one factor times the reference's, in the same direction;
- ``per-tensor``: each tensor's update a factor of its own, in the same direction (a trust ratio,
  a relative step size);
- ``by-shape``: each tensor's update a factor of its own, in the same direction, one factor per shape
  and another for each shape (a scale from rows and columns, as Muon's or a fan-in scale);
- ``""``: the direction differs (the update rule itself).
"""
from __future__ import annotations

import dataclasses
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
    shape: Tuple[int, ...] = ()
    decay: float = 1.0  # relative residual of the update's difference as a multiple of the weights before it
    placed: str = ""  # another tensor whose weights after the step (the reference's) these are

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


def _decay(d, w) -> float:
    """How far the difference of two updates ``d`` is from a multiple of the weights ``w`` (relative): 0
    for a weight decay applied otherwise (decoupled, or coupled in a step without history)."""
    ww, dn = float(w @ w), float(d.norm())
    if ww == 0 or dn == 0:
        return 1.0
    k = float(d @ w) / ww
    return float((d - k * w).norm()) / dn


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
        out[name] = Ratio(c, res, t.dim(), gradless, tuple(t.shape), _decay(a - b, t.double().reshape(-1)))
    return _placed(out, rank.steps[s + 1].params, ref.steps[s + 1].params)


PLACES = 64  # comparisons at most, over all tensors (a failure's cost bounded on a large model)


def _placed(out: Dict[str, Ratio], mine: dict, theirs: dict) -> Dict[str, Ratio]:
    """Each tensor whose update differs, with the name of another tensor of its shape whose weights after
    the step (the reference's) rank 0's are: a result written into another tensor's place."""
    by_shape: Dict[Tuple[int, ...], List[str]] = {}
    for name, r in out.items():
        by_shape.setdefault(r.shape, []).append(name)
    budget = PLACES
    for name, r in list(out.items()):
        others = [o for o in by_shape[r.shape] if o != name][:budget]
        if r.same or r.residual <= DIRECTION or r.dims < 2 or not others or mine.get(name) is None:
            continue  # an update in the reference's direction is this tensor's own, scaled
        budget -= len(others)
        here = mine[name].double().reshape(-1)
        for o in others:
            there = theirs.get(o)
            there = there.double().reshape(-1) if there is not None and there.numel() == here.numel() else None
            if there is None or bool((there == there[0]).all()):
                continue  # values all alike (zeros, ones): any such tensor would match
            if float((here - there).norm()) <= SAME * float(there.norm()):
                out[name] = dataclasses.replace(r, placed=o)
                break
    return out


def shape_of(found: Dict[str, Ratio], differ: List[str]) -> Tuple[str, str]:
    """(pattern, words) for the tensors ``differ`` (those over the line), read from their ratios."""
    rs = [found[n] for n in differ if n in found]
    if not rs:
        return "", ""
    if all(r.gradless for r in rs):
        return "gradless", "none of them gets a gradient on either side: they are updated outside the optimizer"
    placed = [(n, found[n].placed) for n in differ if n in found and found[n].placed]
    if placed:
        return "placed", ", ".join(f"{n} holds the reference's {o}" for n, o in placed[:3])
    agree = [r for n, r in found.items() if n not in differ and r.same]
    along = all(r.residual <= DIRECTION and math.isfinite(r.c) for r in rs)
    shaped = _by_shape(rs) if along else ""
    if shaped:
        return "by-shape", shaped
    if all(r.dims <= 1 for r in rs) and any(r.dims > 1 for r in agree):
        return "1-D", "only 1-D tensors (biases, norm weights) update otherwise; every matrix's update agrees"
    if all(r.dims > 1 for r in rs) and any(r.dims <= 1 for r in agree):
        only = "only the matrices update otherwise"
        rest = "every 1-D tensor's (biases, norm weights) update agrees"
        if along:
            return "N-D", f"{only}, each in its direction by a factor of its own; {rest}"
        if all(r.decay <= DIRECTION for r in rs):
            return "N-D", f"{only}, each by a multiple of its weights (a weight decay); {rest}"
        return "N-D-rule", f"{only}, in another direction than the reference's; {rest}"
    if along:
        cs = sorted(r.c for r in rs)
        if _alike(cs):
            return "uniform", f"each update is {cs[len(cs) // 2]:.4g}x the reference's, in its direction"
        return "per-tensor", (f"each tensor's update is the reference's by a factor of its own ({cs[0]:.3g}x to "
                              f"{cs[-1]:.3g}x), in its direction")
    return "", ""


def _alike(cs: List[float]) -> bool:
    return max(cs) - min(cs) <= 0.02 * max(abs(min(cs)), abs(max(cs)))


def _by_shape(rs: List[Ratio]) -> str:
    """Words for updates scaled by one factor per tensor shape, another for each of two or more shapes, some
    shape held by two tensors or more (``""`` where the factors do not follow the shapes)."""
    per: Dict[Tuple[int, ...], List[float]] = {}
    for r in rs:
        if not r.gradless:  # a copy updated outside the optimizer (an EMA) shares a trained tensor's shape
            per.setdefault(r.shape, []).append(r.c)
    if len(per) < 2 or all(len(cs) < 2 for cs in per.values()) or not all(_alike(cs) for cs in per.values()):
        return ""  # a shape held by one tensor alone tells a shape's factor from a tensor's nothing
    mid = {shape: sorted(cs)[len(cs) // 2] for shape, cs in per.items()}
    if _alike(list(mid.values())):
        return ""  # one factor for all: uniform
    shown = ", ".join(f"{c:.3g}x for {'x'.join(map(str, shape))}" for shape, c in sorted(mid.items(), key=lambda x: x[1]))
    return f"each update is the reference's scaled by a factor set by the tensor's shape ({shown}), in its direction"
