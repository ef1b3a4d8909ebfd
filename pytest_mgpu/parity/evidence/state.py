"""Phase 1, the state a step starts from: the parameters the optimizer holds (those of the model
run forward, or of a copy), the weights (between ranks that should hold the same, and against the
reference before any update, in the shards other ranks hold), the learning rate and the other hyperparameters each
optimizer stepped with, the optimizer's state, and the state no optimizer steps (an EMA teacher,
buffers). Read exactly where the value is exact (a learning rate is one float on both sides)."""
from __future__ import annotations

import math
from typing import Dict, List, Optional, Tuple

from .facts import REFERENCE, UserFacts
from .finding import Finding, Report, listed, over, plain_name, replica_of

SAME_LR = 1e-9  # relative: one schedule computes the same float on both sides
SAME_STATE = 1e-4  # relative: fingerprints of state no optimizer steps (an EMA of equal weights)


def _differs(a: float, b: float, rel: float) -> bool:
    return abs(a - b) > rel * max(abs(a), abs(b), 1e-30)


def findings(report: Report, f: UserFacts) -> List[Finding]:
    """Every state finding, at any step (the causes table takes the earliest)."""
    out = [_nonfinite(f), _foreign(f), _start(report, f), _modes(f), _lr(f), _hyper(f), _optimizer_state(f),
           _untrained(f)]
    return [x for x in out if x is not None]


def _nonfinite(f: UserFacts) -> Optional[Finding]:
    if not f.nonfinite:
        return None
    who = sorted(f.nonfinite, key=lambda w: w != REFERENCE)[-1]
    names = f.nonfinite[who]
    return Finding(0, "state", "a value", "nonfinite",
                   f"at step 0, before any update, {len(names)} parameter(s) of {who} hold inf or NaN ({listed(names)})",
                   "That is memory never initialised: a model built on the meta device and moved with to_empty(), "
                   "whose reset_parameters()/init_weights() does not reset every module, or a checkpoint holding "
                   "NaN. Fix: initialise every parameter after to_empty() (model.apply(init) over all submodules).")


def _foreign(f: UserFacts) -> Optional[Finding]:
    if not f.foreign:
        return None
    who = sorted(f.foreign)[0]
    names, unstepped = f.foreign[who], f.unstepped.get(who, [])
    loose = f", while the model run forward has {len(unstepped)} parameter(s) with gradients that no optimizer " \
        f"steps ({listed(unstepped, 3)})" if unstepped else ""
    return Finding(0, "state", "all tensors", "update-foreign",
                   f"in {who} the optimizer steps {len(names)} parameter(s) that belong to no model run forward{loose}")


def _start(report: Report, f: UserFacts) -> Optional[Finding]:
    """Step 0's weights: between ranks that should hold the same, then against the reference. Only
    where step 0's parameters are the weights before any update (a fact of the run: assert_parity of
    your module compares them after each step's update, so a difference there is no start)."""
    if not f.params_before_update:
        return None
    apart = over(report, 0, "param", replicas=True)
    if apart:
        worst = max(apart, key=lambda e: e.rel)
        ranks = sorted({r for e in apart if (r := replica_of(e)) is not None})
        what = (f"at step 0 the weights before any update already differ between ranks (rank "
                f"{', '.join(map(str, ranks))} vs rank 0: {len(apart)} tensor(s), e.g. {plain_name(worst)} "
                f"{worst.rel:.3g} rel)")
        return Finding(0, "state", "one rank alone", "start-apart", what,
                       "The model is initialized differently per rank (a seed that depends on the rank, or random "
                       "init after seeding per rank) and never broadcast. Fix: seed every rank alike before building "
                       "the model, or broadcast rank 0's parameters (DDP's constructor does; FSDP1: "
                       "sync_module_states=True).", names=tuple(map(str, ranks)))
    other = over(report, 0, "param", replicas=False)
    off = {n: r for n, r in f.pieces_off.items() if any(e.name == n for e in other)}
    if off and not f.nonfinite:
        name, ranks = next(iter(off.items()))
        return Finding(0, "state", "certain rows", "shard-slice",
                       f"at step 0 rank(s) {', '.join(map(str, ranks))} hold a piece of {name} ({f.hand_sharded[name]}) "
                       f"that is not their slice of the reference's starting weights ({len(off)} tensor(s) sharded by "
                       f"hand: {listed(list(off), 3)})", names=tuple(map(str, ranks)))
    if other and f.shards_apart and not f.nonfinite:
        return Finding(0, "state", "certain rows", "start-apart",
                       f"at step 0 the weights before any update differ from the reference's only in the shards of rank(s) "
                       f"{', '.join(map(str, f.shards_apart))} ({len(other)} tensor(s); rank 0's shards agree)",
                       names=tuple(map(str, f.shards_apart)))
    if other and not f.nonfinite:
        worst = max(other, key=lambda e: e.rel)
        return Finding(0, "state", "all tensors", "start-other",
                       f"at step 0 the weights before any update differ from the reference's ({len(other)} "
                       f"tensor(s), e.g. {worst.name} {worst.rel:.3g} rel)",
                       "fn and reference_fn build their models from another seed or in another order (a random "
                       "op between seeding and building on one side, or another init). Fix: seed both sides alike "
                       "right before building the model, or load one state_dict into both.")
    return None


def _lr_of(lrs: List[float]) -> Optional[float]:
    return lrs[0] if lrs else None


def _lr(f: UserFacts) -> Optional[Finding]:
    """The first step at which some rank stepped with another learning rate than the reference."""
    for step, (ranks, ref) in enumerate(zip(f.rank_lrs, f.ref_lrs)):
        if not ref:
            continue
        off = [r for r, lrs in enumerate(ranks) if lrs and any(_differs(a, b, SAME_LR) for a, b in zip(lrs, ref))]
        if not off:
            continue
        if len(off) < len(ranks) and f.world_size > 1:
            r = off[0]
            return Finding(step, "state", "one rank alone", "lr-rank",
                           f"at step {step} rank {r} stepped with lr {ranks[r][0]:.6g}, rank(s) "
                           f"{', '.join(str(i) for i in range(len(ranks)) if i not in off)} and the reference "
                           f"with {ref[0]:.6g}",
                           "Fix: build the optimizer and scheduler alike on every rank.", names=(str(r),))
        return _schedule(f, step)
    return None


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
    return Finding(first, "state", "a value", "lr-schedule", what, per_step)


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


def _matches(mine: List[Optional[float]], ref: List[Optional[float]], index) -> bool:
    """The ranks' lr at every step s is the reference's at step ``index(s)`` (at least two such steps)."""
    pairs = [(a, ref[index(s)]) for s, a in enumerate(mine) if 0 <= index(s) < len(ref) and a is not None]
    return len(pairs) >= 2 and all(r is not None and not _differs(a, r, SAME_LR) for a, r in pairs)


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
        j = next((j for j, r in enumerate(ref) if j >= start and r is not None and not _differs(a, r, SAME_LR)), None)
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
        if len(pairs) >= 2 and all(r is not None and not _differs(a, r, SAME_LR) for a, r in pairs if a is not None):
            return True
    return False


def _settled(mine: List[Optional[float]], ref: List[Optional[float]]) -> int:
    """The first step from which the ranks' lr is one factor of the reference's to the end."""
    ratios = [a / r if a is not None and r else math.nan for a, r in zip(mine, ref)]
    s = len(ratios) - 1
    while s > 0 and math.isfinite(ratios[s - 1]) and not _differs(ratios[s - 1], ratios[-1], SAME_LR):
        s -= 1
    return s


def settled_factor(mine: List[Optional[float]], ref: List[Optional[float]], world: int) -> float:
    """W or 1/W where the ranks' lr comes monotonically to that factor of the reference's at the last step,
    from the same lr at the first (a warm-up from one start lr on both sides to base lrs W apart), or stays
    at it for the last two steps or more; 0 else."""
    ratios = [a / r for a, r in zip(mine, ref) if a is not None and r]
    if world < 2 or len(ratios) < 3:
        return 0.0
    if _differs(ratios[-1], ratios[-2], SAME_LR) and _differs(ratios[0], 1.0, SAME_LR):
        return 0.0
    k = ratios[-1]
    toward = all((a - k) * (ratios[0] - k) >= 0 and abs(a - k) >= abs(b - k) for a, b in zip(ratios, ratios[1:]))
    near = next((t for t in (world, 1 / world) if abs(k / t - 1) < 0.02), 0.0)
    return near if toward else 0.0


def _hyper(f: UserFacts) -> Optional[Finding]:
    """Another number of param groups, another size of a group, or another weight decay, momentum,
    betas or eps on some rank than in the reference (a group's size only where every rank holds the
    whole model: a pipeline stage's or an expert's optimizer holds its part)."""
    for step, (ranks, ref) in enumerate(zip(f.rank_hyper, f.ref_hyper)):
        for r, groups in enumerate(ranks):
            if len(groups) != len(ref):
                return Finding(step, "state", "a value", "groups",
                               f"at step {step} rank {r}'s optimizer has {len(groups)} param group(s), the reference's "
                               f"{len(ref)}", names=("param groups",))
            for g, (mine, theirs) in enumerate(zip(groups, ref)):
                diff = [k for k in mine if k in theirs and _differs(mine[k], theirs[k], SAME_LR)
                        and not (k == "parameters" and f.partial_ranks)]
                if diff:
                    return _hyper_finding(f, step, r, g, diff[0], ranks, mine, theirs)
    return None


def _hyper_finding(f: UserFacts, step: int, r: int, g: int, k: str, ranks: List[List[Dict[str, float]]],
                   mine: Dict[str, float], theirs: Dict[str, float]) -> Finding:
    alone = f.world_size > 1 and any(
        len(o) > g and not _differs(o[g].get(k, math.nan), theirs[k], SAME_LR) for o in ranks)
    who = f"rank {r}" if alone else "the ranks"
    if k == "parameters":
        return Finding(step, "state", "one rank alone" if alone else "a value", "groups",
                       f"at step {step} param group {g} of {who} holds {mine[k]:.0f} parameter elements, the "
                       f"reference's {theirs[k]:.0f}", names=("param groups",))
    return Finding(step, "state", "one rank alone" if alone else "a value", "hyper",
                   f"at step {step} {who} stepped param group {g} with {k}={mine[k]:.6g}, the reference with "
                   f"{k}={theirs[k]:.6g}", names=(k,))


def _modes(f: UserFacts) -> Optional[Finding]:
    """BatchNorm or dropout modules in eval mode on one side and not on the other."""
    for step, (ranks, ref) in enumerate(zip(f.rank_modes, f.ref_modes)):
        mine = ranks[0] if ranks else (0, 0)
        if mine[1] and mine[1] == ref[1] and mine[0] != ref[0]:
            return Finding(step, "state", "a value", "modes",
                           f"at step {step} {mine[0]} of the ranks' {mine[1]} BatchNorm/dropout modules were in eval "
                           f"mode, {ref[0]} of the reference's")
    return None


def _optimizer_state(f: UserFacts) -> Optional[Finding]:
    """Step counters that differ, or one side with no state where the other has some."""
    for step, (ranks, theirs) in enumerate(zip(f.rank_states, f.ref_states)):
        if not ranks:
            continue
        held, count = ranks[0]
        ref_held, ref_count = theirs
        counters = count >= 0 and ref_count >= 0 and count != ref_count
        fresh = step > 0 and (held == 0) != (ref_held == 0)
        if not (counters or fresh):
            continue
        return Finding(step, "state", "a value", "optimizer-state",
                       f"before step {step} fn on the ranks' optimizer held state for {held} parameter(s) (step "
                       f"count {count:g}), reference_fn's for {ref_held} (step count {ref_count:g})")
    return None


def _untrained(f: UserFacts) -> Optional[Finding]:
    """State no optimizer steps (an EMA teacher, buffers): ranks apart, or apart from the reference."""
    for step, ranks in enumerate(f.untrained):
        if not ranks or not ranks[0]:
            continue
        first = ranks[0]
        for r, mine in enumerate(ranks[1:], start=1):
            apart = _apart(mine, first)
            if apart:
                return Finding(step, "state", "one rank alone", "untrained-rank",
                               f"before step {step} the state no optimizer steps differs between ranks (rank {r} vs "
                               f"rank 0: {listed(apart)})", names=tuple(apart))
        ref = f.ref_untrained[step] if step < len(f.ref_untrained) else {}
        apart = _apart(first, ref)
        if apart and step > 0:
            before = f.untrained[step - 1][0] if f.untrained[step - 1] else {}
            agreed = not _apart(before, f.ref_untrained[step - 1]) if step - 1 < len(f.ref_untrained) else False
            return Finding(step, "state", "some modules", "untrained-other",
                           f"before step {step} the state no optimizer steps differs from the reference's "
                           f"({listed(apart)})" + (f", while it agreed before step {step - 1}" if agreed else ""),
                           names=tuple(apart))
    return None


def _apart(mine: Dict[str, float], theirs: Dict[str, float]) -> List[str]:
    return [n for n, v in mine.items() if n in theirs and math.isfinite(v) and math.isfinite(theirs[n])
            and _differs(v, theirs[n], SAME_STATE)]
