"""Phase 3 read from the model's outputs: at the first step, where the ranks' output rows are the
reference's (the same rows in, the same weights, the same outputs out), the gradient the loss gave
each output row against the reference's (``record/probe.py``). A loop whose rows agree there up to
one factor common to every row (the world size of a mean, 1 of a sum) computes its loss as the
reference does; what else is seen names how the loss is computed otherwise from the same outputs:
positions the loss reads on one side only (a mask, padding, ignored labels), the positions shifted
by one (targets aligned otherwise), each rank's rows scaled by a factor of its own (a normalisation
over the rank's rows), rows weighted otherwise (per-row weights, a mean over a row's positions
where the reference sums), or rows given another row's terms. Outputs that differ for the same rows
and weights, at the step where training diverges first, say the forward computes otherwise."""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from ..record.trail import FED
from .facts import UserFacts
from .finding import Finding, over
from .forward_causes import LAYOUTS
from .fed import fed_kind
from .routed import first_routed, routed_first
from .trail import first_apart

AGREE = 1e-4  # relative: an output row that is the reference's (its fingerprint and its norm)
SAME = 1e-2  # relative: a gradient row that is a multiple of the reference's (the residual)
FACTOR = 1e-3  # relative: two factors that are one
ZERO = 1e-7  # relative to the row's largest position: a position the loss does not read


@dataclass
class Pair:
    rank: int
    call: int  # the rank's forward call (its micro-batch) the row was fed in
    row: int  # the row in the rank's forward calls, in order
    ref: int  # the reference's row it is
    g: Any  # the rank's gradient row: float64 [positions, width]
    h: Any  # the reference's


def _rows(probes: List[Any]) -> List[Tuple[float, Tuple[float, float], Any, int]]:
    """(input fingerprint, output (fingerprint, norm), gradient row, call) of every probed row with a finite
    gradient (a GradScaler's overflowed update leaves inf or NaN there: no evidence)."""
    return [(r, o, p.grad[i], c) for c, p in enumerate(probes) if p.grad is not None
            for i, (r, o) in enumerate(zip(p.rows, p.out)) if bool(p.grad[i].isfinite().all())]


def _same_output(a: Tuple[float, float], b: Tuple[float, float], width: int) -> bool:
    scale = max(abs(a[1]), abs(b[1]), 1e-30)
    return abs(a[1] - b[1]) <= AGREE * scale and abs(a[0] - b[0]) <= AGREE * scale * 1.6 * math.sqrt(width)


def pairs(f: UserFacts) -> Tuple[List[Pair], int]:
    """Every rank row mapped to the reference row with its fingerprint (rows unique in the reference) whose
    output is the reference's; and how many mapped rows' outputs are not (the forward differs there)."""
    ref = _rows(f.ref_probes)
    keys: Dict[str, int] = {}
    for j, (r, *_) in enumerate(ref):
        k = f"{r:.12g}"
        keys[k] = -1 if k in keys else j  # a row fed twice (a GAN's fakes, twice): not mapped
    out: List[Pair] = []
    differ = 0
    for rank, probes in enumerate(f.rank_probes):
        for i, (r, o, g, call) in enumerate(_rows(probes)):
            j = keys.get(f"{r:.12g}", -1)
            if j < 0 or ref[j][2].shape != g.shape:
                continue
            if not _same_output(o, ref[j][1], g.numel()):
                differ += 1  # the forward differs: the loss's gradient differs with it
                continue
            out.append(Pair(rank, call, i, j, g, ref[j][2]))
    return out, differ


def _outputs_apart(f: UserFacts) -> Tuple[int, int]:
    """(rank rows whose outputs differ from the reference row with their input, rank rows matched): the
    outputs alone, where no gradient reached them (the model computed its loss inside its forward)."""
    ref: Dict[str, Any] = {}
    for p in f.ref_probes:
        for r, o in zip(p.rows, p.out):
            k = f"{r:.12g}"
            ref[k] = None if k in ref else o
    differ = n = 0
    for probes in f.rank_probes:
        for p in probes:
            for r, o in zip(p.rows, p.out):
                theirs = ref.get(f"{r:.12g}")
                if theirs is not None:
                    n += 1
                    differ += not _same_output(o, theirs, math.prod(p.shape[1:]) if len(p.shape) > 1 else 1)
    return differ, n


def split_pairs(f: UserFacts) -> Tuple[List[Pair], int]:
    """Under a sequence split (rank r fed part r of every reference row): each rank row against its part of
    the reference row's outputs and gradient (positions r x n to (r + 1) x n); as ``pairs``."""
    w, parts = f.sequence_split, f.ref_parts
    ref = [(p, i) for p in f.ref_probes if p.grad is not None and p.outs is not None for i in range(len(p.rows))]
    keys: Dict[str, int] = {}
    for j, v in enumerate(parts):
        k = f"{v:.12g}"
        keys[k] = -1 if k in keys else j
    out: List[Pair] = []
    differ = 0
    for rank, probes in enumerate(f.rank_probes):
        for call, p in enumerate(probes):
            if p.grad is None or p.outs is None:
                continue
            for i, v in enumerate(p.rows):
                j = keys.get(f"{v:.12g}", -1)
                if j < 0 or j % w != rank or j // w >= len(ref):
                    continue
                whole, row = ref[j // w]
                n = p.grad.shape[1]
                if whole.grad.shape[1] != w * n or whole.grad.shape[2] != p.grad.shape[2]:
                    continue
                h, o = whole.grad[row, rank * n:(rank + 1) * n], whole.outs[row, rank * n:(rank + 1) * n]
                if float((p.outs[i] - o).norm()) > AGREE * max(float(o.norm()), 1e-30):
                    differ += 1
                    continue
                out.append(Pair(rank, call, i, j // w, p.grad[i], h))
    return out, differ


def findings(report: Any, f: UserFacts) -> List[Finding]:
    if not f.rank_probes or (f.sequence_split and not f.ref_parts):
        return []
    found, differ = split_pairs(f) if f.sequence_split else pairs(f)
    if differ or (not found and not any(p.out for per_rank in f.rank_probes for p in per_rank)):
        return _forward(report, f, differ, differ + len(found))  # outputs that differ, or none probed: the trail
    if not found and not f.sequence_split:  # outputs probed, no gradient reached them: a loss the model returns
        differ, n = _outputs_apart(f)
        return _forward(report, f, differ, n) if differ else []
    if len(found) < 2:
        return []
    said = _positions(found) or _rows_scaled(found, f)
    return [said] if said is not None else []


def agree(f: UserFacts) -> bool:
    """At the first step the outputs are the reference's and the loss gave them the reference's gradient up
    to one factor common to every row: whatever differs in the parameters' gradients, the model's backward
    made it."""
    if not f.rank_probes or (f.sequence_split and not f.ref_parts):
        return False
    found, differ = split_pairs(f) if f.sequence_split else pairs(f)
    found = [p for p in found if bool(p.g.any()) or bool(p.h.any())]
    if differ or len(found) < 2:
        return False
    fits = [_factor(p) for p in found]
    c0 = statistics.median(c for c, _ in fits)
    return all(r <= SAME and abs(c - c0) <= FACTOR * max(abs(c0), 1e-30) for c, r in fits)


def _forward(report: Any, f: UserFacts, differ: int, n: int) -> List[Finding]:
    """Outputs that differ for the same rows and weights, where step 0 is where training diverges first and
    no dropout draws otherwise: the forward computes otherwise."""
    if f.dropout or report is None or report.first_divergence != 0 or over(report, 0, "param"):
        return []
    said = f"at step 0, with the same weights and rows, the model's outputs differ from the reference's in {differ} of {n} rows"
    missing = _arguments_missing(f) if differ else None
    if missing is not None:
        return [missing]
    apart = first_apart(f)
    routed = first_routed(f)
    if routed is not None and (apart is None or routed_first(f, routed, apart.mark)):
        return [Finding(0, "loss", "certain rows", "forward-other", f"at step 0, same weights and rows: "
                        f"{routed.words()}", names=("routed", routed.name),
                        line=f"{routed.line} ({routed.name})" if routed.line else "")]
    if apart is None:
        return [Finding(0, "loss", "certain rows", "forward-other", said)] if differ else []
    kind = fed_kind(f, apart) if apart.fed else ""
    where = ("fed", apart.mark.name, kind) if apart.fed else ("between", apart.mark.name) if apart.between else \
        ("module", apart.mark.name, apart.mark.key[0])
    more = {"slice": f"; each is another row's {apart.argument}", "draw": "; none is any row's of the reference"}.get(kind, "")
    found = Finding(0, "loss", "certain rows", "forward-other", f"at step 0, same weights and rows: {apart.words()}"
                    f"{more}", names=where, line=apart.line())
    if not differ and any(c.when(found, f) for c in LAYOUTS):
        return []  # no outputs probed, and a layout whose forward exchanges rows: the loss phase names it
    return [found]


def _fed_names(probes: List[Any]) -> List[str]:
    """The tensor arguments of the first probed call that has a trail (positional ones as ``argument <i>``)."""
    for p in probes:
        trail = getattr(p, "trail", None) or []
        names = [m.name for m in trail if m.key[2] == FED]
        if names:
            return names
    return []


def _arguments_missing(f: UserFacts) -> Optional[Finding]:
    """A keyword tensor argument one side passes the model and the other does not, where the ranks pass
    fewer (or more) tensor arguments in all: an attention mask left out, for instance."""
    ref = _fed_names(f.ref_probes)
    mine = _fed_names(next((p for p in f.rank_probes if p), []))
    if not ref or not mine or len(ref) == len(mine):
        return None
    keyword = lambda names: [n for n in names if not n.startswith("argument ")]  # noqa: E731
    only_ref = [n for n in keyword(ref) if n not in mine]
    only_mine = [n for n in keyword(mine) if n not in ref]
    if len(mine) < len(ref) and only_ref:
        what = f"reference_fn passes the model {', '.join(only_ref)}, the ranks do not"
    elif len(mine) > len(ref) and only_mine:
        what = f"the ranks pass the model {', '.join(only_mine)}, reference_fn does not"
    else:
        return None
    return Finding(0, "loss", "certain rows", "forward-other", f"at step 0, same weights and rows: {what}",
                   names=("fed", (only_ref or only_mine)[0], "missing"))


def _read(g, scale: float) -> List[bool]:
    """Which positions of a gradient row the loss read (nonzero)."""
    return [bool(v > ZERO * scale) for v in g.norm(dim=1)]


def _positions(found: List[Pair]) -> Optional[Finding]:
    """Positions read on one side only: shifted by one in every such row, or masked otherwise."""
    if found[0].g.shape[0] < 2:
        return None
    only_ref = only_rank = rows = 0
    shifts = set()
    last = True  # every position only the reference reads is the last it reads in its row
    for p in found:
        scale = max(float(p.g.norm(dim=1).max()), float(p.h.norm(dim=1).max()), 1e-30)
        a, b = _read(p.g, scale), _read(p.h, scale)
        if a == b:
            continue
        rows += 1
        mine = [t for t, (x, y) in enumerate(zip(a, b)) if y and not x]
        only_ref += len(mine)
        only_rank += sum(1 for x, y in zip(a, b) if x and not y)
        last = last and bool(mine) and mine == [max(t for t, y in enumerate(b) if y)]
        shifts.add(next((s for s in (1, -1) if sum(a) == sum(b) and a == [b[t - s] if 0 <= t - s < len(b) else False
                                                                          for t in range(len(b))]), 0))
    if not rows:
        return None
    n = len(found)
    total = sum(int(sum(_read(p.h, max(float(p.h.norm(dim=1).max()), 1e-30)))) for p in found)
    if shifts in ({1}, {-1}):
        way = "later" if shifts == {1} else "earlier"
        return Finding(0, "loss", "certain rows", "loss-shift", f"at step 0, with the same weights and "
                       f"outputs, the ranks' loss reads each row's outputs one position {way} than the reference's "
                       f"({rows} of {n} rows)")
    where = " (the last of each such row)" if last and only_ref and not only_rank else ""
    what = (f"the ranks' loss leaves out {only_ref} of the {total} positions the reference's reads{where}" if not only_rank
            else f"the ranks' loss reads {only_rank} positions the reference's leaves out (of {total} it reads)"
            if not only_ref else f"the ranks' loss reads {only_rank} positions the reference's leaves out and leaves "
            f"out {only_ref} of the {total} it reads")
    return Finding(0, "loss", "certain rows", "loss-positions" if only_ref and not only_rank else
                   "loss-positions-extra" if not only_ref else "loss-positions-other",
                   f"at step 0, with the same weights and outputs, {what}, in {rows} of {n} rows")


def _factor(p: Pair) -> Tuple[float, float]:
    """(c, residual): the rank's row as c x the reference's, and how far it is from that, relative."""
    hh = float((p.h * p.h).sum())
    gg = float((p.g * p.g).sum())
    if hh == 0:
        return (math.inf if gg else 1.0), (1.0 if gg else 0.0)
    c = float((p.g * p.h).sum()) / hh
    return c, math.sqrt(max(gg - c * c * hh, 0.0) / max(gg, c * c * hh, 1e-300))


def _rows_scaled(found: List[Pair], f: UserFacts) -> Optional[Finding]:
    found = [p for p in found if bool(p.g.any()) or bool(p.h.any())]  # a row no loss reads on either side
    if len(found) < 2:
        return None
    fits = [_factor(p) for p in found]
    n = len(found)
    off = [p for p, (c, r) in zip(found, fits) if r > SAME]
    if off:
        return _other_rows(found, off)
    cs = [c for c, _ in fits]
    c0 = statistics.median(cs)
    if all(abs(c - c0) <= FACTOR * max(abs(c0), 1e-30) for c in cs):
        return None  # one factor for every row: the loss's normalisation, read by the other phases
    per_call: Dict[Tuple[int, int], List[float]] = {}
    for p, c in zip(found, cs):
        per_call.setdefault((p.rank, p.call), []).append(c)
    own = {k: statistics.median(v) for k, v in per_call.items()}
    if len(own) > 1 and all(abs(c - own[k]) <= FACTOR * max(abs(own[k]), 1e-30) for k, v in per_call.items() for c in v):
        calls = any(call for _, call in own)
        one = calls and f.rank_backwards <= 1  # several forward calls, one backward: no micro-batches
        unit = "forward call's rows (one backward)" if one else "micro-batch's rows" if calls else "rank's rows"
        shown = ", ".join(f"rank {r}{f' call {c}' if calls else ''}: {x:.4g}x" for (r, c), x in sorted(own.items())[:4])
        return Finding(0, "loss", "certain rows", "loss-call-scale" if one else "loss-rank-scale", f"at step 0, with "
                       f"the same weights and outputs, the loss scales the gradient of each {unit} by a factor "
                       f"of its own ({shown} the reference's)", names=tuple(sorted({str(r) for r, _ in own})))
    lengths = [sum(_read(p.h, max(float(p.h.norm(dim=1).max()), 1e-30))) for p in found]
    lo, hi = min(cs), max(cs)
    span = f"per-row factors {lo:.3g}x to {hi:.3g}x, {n} rows"
    if len(set(lengths)) > 1 and found[0].g.shape[0] > 1:
        for signal, k in (("loss-row-mean", [c * m for c, m in zip(cs, lengths)]),
                          ("loss-row-sum", [c / m for c, m in zip(cs, lengths)])):
            if _per_rank_constant(found, k):
                return Finding(0, "loss", "certain rows", signal, f"at step 0, with the same weights and "
                               f"outputs, the ranks' loss weights each row by {'1/' if signal.endswith('mean') else ''}"
                               f"the number of positions it reads, against the reference's ({span})")
    return Finding(0, "loss", "certain rows", "loss-row-weights", f"at step 0, with the same weights and outputs, "
                   f"the rows' loss gradients are the reference's by {span}")


def _per_rank_constant(found: List[Pair], k: List[float]) -> bool:
    """``k`` is one value within each rank's rows (a value per rank)."""
    per_rank: Dict[int, List[float]] = {}
    for p, x in zip(found, k):
        per_rank.setdefault(p.rank, []).append(x)
    return all(abs(x - v[0]) <= FACTOR * abs(v[0]) for v in per_rank.values() for x in v)


def _other_rows(found: List[Pair], off: List[Pair]) -> Finding:
    """Rows whose gradient is no multiple of their own reference row's: another row's (per-row terms read at
    another offset), or none (the loss's formula or targets differ on the same outputs)."""
    refs = {p.ref: p.h for p in found}
    moved = []
    for p in off:
        for j, h in refs.items():
            if j != p.ref and _factor(Pair(p.rank, p.call, p.row, j, p.g, h))[1] <= SAME:
                moved.append((p, j))
                break
    if moved and len(moved) * 2 >= len(off):
        e = ", ".join(f"rank {p.rank} row {p.row} ~ reference row {j}" for p, j in moved[:2])
        return Finding(0, "loss", "certain rows", "loss-rows-moved", f"at step 0, with the same weights and outputs, "
                       f"{len(moved)} of {len(found)} rows get the loss gradient of another reference row ({e})")
    return Finding(0, "loss", "certain rows", "loss-formula", f"at step 0, with the same weights and outputs, the "
                   f"loss gradient of {len(off)} of {len(found)} rows is no multiple of the reference's")
