"""The learning rate each side stepped with, read as a schedule: the first step where some rank's lr
differs from the reference's, and how the ranks' schedule runs against the reference's (a factor, faster,
ahead, at half the rate, frozen). Exact: a learning rate is one float on both sides."""
from __future__ import annotations

import math
from typing import List, Optional, Tuple

from .facts import UserFacts
from .finding import Finding
from .plateau import SAME_METRIC, plateau_words

SAME_LR = 1e-9  # relative: one schedule computes the same float on both sides


def differs(a: float, b: float, rel: float) -> bool:
    """``a`` and ``b`` further apart than ``rel`` of the larger."""
    return abs(a - b) > rel * max(abs(a), abs(b), 1e-30)


def _lr_of(lrs: List[float]) -> Optional[float]:
    return lrs[0] if lrs else None


def lr_finding(f: UserFacts) -> Optional[Finding]:
    """The first step at which some rank stepped with another learning rate than the reference."""
    for step, (ranks, ref) in enumerate(zip(f.rank_lrs, f.ref_lrs)):
        if not ref:
            continue
        off = [r for r, lrs in enumerate(ranks) if lrs and any(differs(a, b, SAME_LR) for a, b in zip(lrs, ref))]
        if not off:
            continue
        if len(off) < len(ranks) and f.world_size > 1:
            r = off[0]
            by_metric = metric_finding(f, step, r)
            if by_metric is not None:
                return by_metric
            return Finding(step, "state", "one rank alone", "lr-rank",
                           f"at step {step} rank {r} stepped with lr {ranks[r][0]:.6g}, rank(s) "
                           f"{', '.join(str(i) for i in range(len(ranks)) if i not in off)} and the reference "
                           f"with {ref[0]:.6g}",
                           "Fix: build the optimizer and scheduler alike on every rank.", names=(str(r),))
        return _groups(f, step, ranks[off[0]], ref) or _schedule(f, step)
    return None


def metric_finding(f: UserFacts, step: int, r: int) -> Optional[Finding]:
    """Rank ``r``'s lr differs at ``step``, and before it the ranks gave their scheduler (``ReduceLROnPlateau``)
    metrics that differ: each its own value, not one reduced across them. Where a rank's metric is the loss
    it backpropagated at that step (a GradScaler's scale divided out), that is said."""
    for s in range(1, min(step, len(f.rank_metrics) - 1) + 1):  # a metric given after step s - 1
        given = [m[-1] if m else math.nan for m in f.rank_metrics[s]]
        if len(given) < 2 or not all(math.isfinite(v) for v in given) or \
                not any(differs(v, given[0], SAME_METRIC) for v in given):
            continue
        ref = f.ref_metrics[s] if s < len(f.ref_metrics) and f.ref_metrics[s] else []
        theirs = f" (the reference {ref[-1]:.4g})" if ref else ""
        values = ", ".join(f"{v:.4g} on rank {i}" for i, v in enumerate(given[:4]))
        own = all(_is_training_loss(f, s - 1, i, v) for i, v in enumerate(given))
        return Finding(step, "state", "one rank alone", "lr-metric-loss" if own else "lr-metric",
                       f"scheduler.step(metric) after step {s - 1} got {values}{theirs}"
                       f"{', the loss each backpropagated' if own else ''}; at step {step} rank {r}'s lr is "
                       f"{f.rank_lrs[step][r][0]:.4g}, the reference's {f.ref_lrs[step][0]:.4g}", names=(str(r),))
    return None


def _is_training_loss(f: UserFacts, step: int, r: int, metric: float) -> bool:
    """``metric`` is the loss rank ``r`` backpropagated at ``step`` (divided by its GradScaler's scale)."""
    losses = f.rank_losses[step] if 0 <= step < len(f.rank_losses) else []
    scalers = f.rank_scaler[step] if step < len(f.rank_scaler) else []
    scale = scalers[r][0] if r < len(scalers) and scalers[r] and math.isfinite(scalers[r][0]) else 1.0
    return r < len(losses) and math.isfinite(losses[r]) and not differs(losses[r] / scale, metric, SAME_METRIC)


def _groups(f: UserFacts, step: int, mine: List[float], ref: List[float]) -> Optional[Finding]:
    """The param groups' lrs stand otherwise to each other on the ranks than in the reference (each
    group's ratio ranks/reference is not one factor): a per-group scale (layer-wise lr decay's
    ``lr_scale``, a head's own lr) left out, reversed or applied to other groups."""
    if len(mine) < 2 or len(mine) != len(ref) or not all(ref):
        return None
    ratios = [a / b for a, b in zip(mine, ref)]
    if not any(differs(k, ratios[0], SAME_LR) for k in ratios):
        return None
    one = not any(differs(a, mine[0], SAME_LR) for a in mine)
    theirs = f"the reference's {len(ref)} groups with {min(ref):.6g} to {max(ref):.6g}"
    what = (f"at step {step} every param group of the ranks stepped with lr {mine[0]:.6g}, {theirs}" if one else
            f"at step {step} the ranks' {len(mine)} param groups stepped with lr {min(mine):.6g} to {max(mine):.6g}, "
            f"{theirs}, in other proportions (ranks/reference: {min(ratios):.4g}x to {max(ratios):.4g}x by group)")
    return Finding(step, "state", "a value", "lr-groups", what, "", value=len(mine))


def _schedule(f: UserFacts, first: int) -> Finding:
    steps = min(len(f.rank_lrs), len(f.ref_lrs))
    mine = [_lr_of(f.rank_lrs[s][0]) if f.rank_lrs[s] else None for s in range(steps)]
    ref = [_lr_of(lrs) for lrs in f.ref_lrs[:steps]]
    shown = ", ".join(f"{a:.4g}/{b:.4g}" for a, b in list(zip(mine, ref))[:6] if a is not None and b is not None)
    what = f"at step {first} the ranks stepped with lr {mine[first]:.6g}, the reference with {ref[first]:.6g}"
    per_step = f"Ranks/reference lr per step: {shown}{', ...' if steps > 6 else ''}."
    ratios = {round(a / b, 6) for a, b in zip(mine, ref) if a is not None and b}
    ahead = _ahead(mine, ref)
    w = f.world_size
    scaled = all(w > 1 and (abs(k * w - 1) < 0.02 or abs(k / w - 1) < 0.02) for k in ratios)
    if len(ratios) == 1 and (scaled or not ahead):
        k = ratios.pop()  # an exponential schedule one step ahead is a constant ratio too: a scaling unless ahead
        return Finding(first, "state", "a uniform factor", "lr-factor", what + f", {k:.4g}x at every step",
                       per_step, value=k)
    plateau = plateau_words(f, first)
    if plateau:
        return Finding(first, "state", "a value", "lr-plateau", what + plateau, per_step)
    apart = {k for k in ratios if abs(k - 1) > 1e-6}
    if len(ratios) > 1 and len(apart) == 1 and (_interleaved(mine, ref) or w > 1 and any(
            abs(x * w - 1) < 0.02 or abs(x / w - 1) < 0.02 for x in apart)):
        k = apart.pop()  # one optimizer of several (a GAN's D) or some steps: the others' lrs agree
        return Finding(first, "state", "a uniform factor", "lr-factor", what + f", {k:.4g}x at every step whose lr "
                       "differs (the other steps' agree: another optimizer's)", per_step, value=k)
    tends = settled_factor(mine, ref, w)
    if tends:
        return Finding(first, "state", "a uniform factor", "lr-factor", what + f", {tends:.4g}x from step "
                       f"{_settled(mine, ref)} on (once warm-up ends)", per_step, value=tends)
    faster = _faster(mine, ref)
    if faster:
        return Finding(first, "state", "a value", "lr-faster",
                       what + f"; the ranks' lr at step s is the reference's at step {faster}s", per_step, value=faster)
    if ahead:
        return Finding(first, "state", "a value", "lr-ahead", what + f"; the ranks' lr at step s is the reference's "
                       f"at step s + {ahead}: their schedule runs {ahead} step(s) ahead", per_step, value=ahead)
    behind, end = _behind(mine, ref)
    if behind:
        span = f"in steps 0-{end}, the same after them" if end < len(mine) - 1 else "at every step"
        return Finding(first, "state", "a value", "lr-behind", what + f"; the ranks' lr at step s is the reference's "
                       f"at step s - {behind} {span} (at step 0: {mine[0]:.4g}): their schedule runs {behind} step(s) "
                       "behind", per_step, value=behind)
    least, most = _drifts_ahead(mine, ref)
    if least:
        return Finding(first, "state", "a value", "lr-ahead", what + f"; the ranks' lr at step s is the reference's "
                       f"at a later step, {least} to {most} step(s) ahead and further as the run goes on: their "
                       "schedule runs ahead", per_step, value=most)
    if _slower(mine, ref):
        return Finding(first, "state", "a value", "lr-slower", what + "; the ranks' lr at step 2s is the reference's "
                       "at step s: their schedule runs at half its rate", per_step, value=0.5)
    known = [a for a in mine if a is not None]
    if len(known) >= 3 and len(set(known)) == 1 and len({r for r in ref if r is not None}) > 1:
        return Finding(first, "state", "a value", "lr-frozen", what + f"; the ranks' lr stays {known[0]:.6g} at every "
                       "step while the reference's schedule moves", per_step)
    held = _held(mine, ref)
    if held:
        return Finding(first, "state", "a value", "lr-held", what + f"; the ranks' lr changes every {held} steps "
                       f"(steps 0-{held - 1}: {mine[0]:.4g})", per_step, value=held)
    k, end = _warm_up_ratio(mine, ref)
    if k:
        return Finding(first, "state", "a value", "lr-warm-up", what + f"; in the reference's warm-up (steps 0-{end}) "
                       f"the ranks' lr is {k:.4g}x its own", per_step, value=k)
    return Finding(first, "state", "a value", "lr-schedule", what, per_step)


def _held(mine: List[Optional[float]], ref: List[Optional[float]]) -> int:
    """k >= 2 where the ranks' lr holds one value over each block of k steps (two blocks or more, the
    last may be short) and the reference's changes at every step inside the first block: an lr set
    once per epoch (from the integer epoch) where the reference sets it every iteration; 0 else."""
    a, r = [x for x in mine if x is not None], [x for x in ref if x is not None]
    if len(a) < len(mine) or len(r) < len(ref):
        return 0
    k = next((i for i in range(1, len(a)) if differs(a[i], a[i - 1], SAME_LR)), 0)
    if k < 2 or 2 * k > len(a):
        return 0
    flat = all(not differs(x, a[i - i % k], SAME_LR) for i, x in enumerate(a))  # one value per block of k
    moves = all(differs(r[i], r[i - 1], SAME_LR) for i in range(1, k))
    return k if flat and moves else 0


def _warm_up_ratio(mine: List[Optional[float]], ref: List[Optional[float]]) -> Tuple[float, int]:
    """(k, end) where the reference's lr rises at every step of its warm-up and the ranks' is k x it (k
    not 1) at each of its first steps with an lr above 0, two or more, to step ``end``: a warm-up counted
    in other units on the ranks (iterations from the rank's loader or batch, epochs); (0, 0) else."""
    rise = 0
    while rise + 1 < len(ref) and (ref[rise] or 0.0) < (ref[rise + 1] or 0.0) and ref[rise] is not None:
        rise += 1
    pairs = [(s, a / r) for s, (a, r) in enumerate(zip(mine[:rise + 1], ref[:rise + 1])) if a is not None and r]
    if len(pairs) < 2 or rise + 1 >= len(ref):
        return 0.0, 0
    k = pairs[0][1]
    same = [s for s, x in pairs if not differs(x, k, 1e-6)]
    if not differs(k, 1.0, 1e-3) or len(same) < 2 or same != [s for s, _ in pairs[:len(same)]]:
        return 0.0, 0
    return k, same[-1]


def schedule_rate(mine: List[Optional[float]], ref: List[Optional[float]]) -> str:
    """How one side's schedule runs against the other's, where one rule holds at two steps or more:
    "2x faster (the lr at step s is the other's at step 2s)", "1 step(s) ahead (...)", "at half the
    rate (...)"; "" where none does."""
    faster, ahead = _faster(mine, ref), _ahead(mine, ref)
    if faster:
        return f"{faster}x faster (the lr at step s is the other's at step {faster}s)"
    if ahead:
        return f"{ahead} step(s) ahead (the lr at step s is the other's at step s + {ahead})"
    least, most = _drifts_ahead(mine, ref)
    if least:
        return f"ahead, further as the run goes on (the lr at step s is the other's at step s + {least} to s + {most})"
    return "at half the rate (the lr at step 2s is the other's at step s)" if _slower(mine, ref) else ""


def _behind(mine: List[Optional[float]], ref: List[Optional[float]]) -> Tuple[int, int]:
    """(b, end) where the steps whose lr differs are steps 0-end, and at each of them from step b on the
    ranks' lr is the reference's at step s - b (a warm-up counted from 0: its first step at lr 0, then one
    step late until the warm-up ends, or all along); (0, 0) where not."""
    if len({r for r in ref if r is not None}) < 2 or any(a is None for a in mine) or any(r is None for r in ref):
        return 0, 0
    all_along = next((b for b in (1, 2) if _matches(mine, ref, lambda s: s - b)), 0)
    if all_along:
        return all_along, len(mine) - 1
    off = [s for s, (a, r) in enumerate(zip(mine, ref)) if differs(a, r, SAME_LR)]  # type: ignore[arg-type]
    if not off or off != list(range(len(off))):
        return 0, 0
    for b in (1, 2):
        later = [s for s in off if s >= b]
        if later and all(not differs(mine[s], ref[s - b], SAME_LR) for s in later):  # type: ignore[arg-type]
            return b, off[-1]
    return 0, 0


def _interleaved(mine: List[Optional[float]], ref: List[Optional[float]]) -> bool:
    """The steps whose lr differs come back every p steps (p from 2 to 6, two more steps seen), two or more, and the
    others' agree, two or more: the steps of one optimizer among several (a GAN's D and G)."""
    off = [a is not None and r is not None and differs(a, r, SAME_LR) for a, r in zip(mine, ref)]
    if sum(off) < 2 or len(off) - sum(off) < 2:
        return False
    return any(all(off[i] == off[i % p] for i in range(len(off))) for p in range(2, 7) if p + 2 <= len(off))


def _matches(mine: List[Optional[float]], ref: List[Optional[float]], index) -> bool:
    """The ranks' lr at every step s is the reference's at step ``index(s)`` (at least two such steps)."""
    pairs = [(a, ref[index(s)]) for s, a in enumerate(mine) if 0 <= index(s) < len(ref) and a is not None]
    return len(pairs) >= 2 and all(r is not None and not differs(a, r, SAME_LR) for a, r in pairs)


def _faster(mine: List[Optional[float]], ref: List[Optional[float]]) -> int:
    """k > 1 where the ranks' lr at every step s is the reference's at step k*s + b for one b."""
    known = [r for r in ref if r is not None]
    if len(set(known)) < 2:
        return 0
    return next((k for k in (2, 3, 4, 8) for b in range(k + 1) if _matches(mine, ref, lambda s: k * s + b)), 0)


def _ahead(mine: List[Optional[float]], ref: List[Optional[float]]) -> int:
    """b >= 1 where the ranks' lr at every step s is the reference's at step s + b (a scheduler stepped
    before the optimizer, or on steps the optimizer skipped)."""
    if len({r for r in ref if r is not None}) < 2:
        return 0
    return next((b for b in range(1, len(ref) - 1) if _matches(mine, ref, lambda s: s + b)), 0)


def _drifts_ahead(mine: List[Optional[float]], ref: List[Optional[float]]) -> Tuple[int, int]:
    """(least, most) where the ranks' lr at every step s is the reference's at a later step s + b(s), b
    never shrinking and growing somewhere (a scheduler also stepped on iterations a GradScaler skipped:
    one step further ahead per skip); (0, 0) where it is not, or fewer than two steps are known."""
    if len({r for r in ref if r is not None}) < 2:
        return 0, 0
    offsets: List[int] = []
    for s, a in enumerate(mine):
        if a is None:
            continue
        start = s + max(offsets[-1] if offsets else 1, 1)
        j = next((j for j, r in enumerate(ref) if j >= start and r is not None and not differs(a, r, SAME_LR)), None)
        if j is None:
            return 0, 0
        offsets.append(j - s)
    return (offsets[0], offsets[-1]) if len(offsets) >= 2 and offsets[-1] > offsets[0] else (0, 0)


def _slower(mine: List[Optional[float]], ref: List[Optional[float]]) -> bool:
    """The ranks' lr at step s is the reference's at step s // 2 (and not constant): half the rate; or,
    a schedule built for twice the steps (a linear warm-up over 2n), at every other step: the ranks' lr
    at step 2t + b is the reference's at step t, for one b."""
    known = [a for a in mine if a is not None]
    if len(set(known)) < 2:
        return False
    if _matches(mine, ref, lambda s: s // 2):
        return True
    for b in (0, 1):
        pairs = [(a, ref[(s - b) // 2]) for s, a in enumerate(mine)
                 if s >= b and (s - b) % 2 == 0 and (s - b) // 2 < len(ref) and a is not None]
        if len(pairs) >= 2 and all(r is not None and not differs(a, r, SAME_LR) for a, r in pairs if a is not None):
            return True
    return False


def _settled(mine: List[Optional[float]], ref: List[Optional[float]]) -> int:
    """The first step from which the ranks' lr is one factor of the reference's to the end."""
    ratios = [a / r if a is not None and r else math.nan for a, r in zip(mine, ref)]
    s = len(ratios) - 1
    while s > 0 and math.isfinite(ratios[s - 1]) and not differs(ratios[s - 1], ratios[-1], SAME_LR):
        s -= 1
    return s


def settled_factor(mine: List[Optional[float]], ref: List[Optional[float]], world: int) -> float:
    """W or 1/W where the ranks' lr comes monotonically to that factor of the reference's at the last step,
    from the same lr at the first (a warm-up from one start lr on both sides to base lrs W apart), or stays
    at it for the last two steps or more; 0 else."""
    ratios = [a / r for a, r in zip(mine, ref) if a is not None and r]
    if world < 2 or len(ratios) < 3:
        return 0.0
    if differs(ratios[-1], ratios[-2], SAME_LR) and differs(ratios[0], 1.0, SAME_LR):
        return 0.0
    k = ratios[-1]
    toward = all((a - k) * (ratios[0] - k) >= 0 and abs(a - k) >= abs(b - k) for a, b in zip(ratios, ratios[1:]))
    near = next((t for t in (world, 1 / world) if abs(k / t - 1) < 0.02), 0.0)
    return near if toward else 0.0
