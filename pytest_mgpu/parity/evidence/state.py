"""Phase 1, the state a step starts from: the parameters the optimizer holds (those of the model
run forward, or of a copy), the weights (between ranks that should hold the same, and against the
reference before any update, in the shards other ranks hold), the learning rate and the other hyperparameters each
optimizer stepped with, the optimizer's state, and the state no optimizer steps (an EMA teacher,
buffers). Read exactly where the value is exact (a learning rate is one float on both sides)."""
from __future__ import annotations

import math
from typing import Dict, List, Optional

from . import ema
from .facts import REFERENCE, UserFacts
from .finding import Finding, Report, listed, over, plain_name, replica_of
from .schedule import SAME_LR, differs, lr_finding

SAME_STATE = 1e-4  # relative: fingerprints of state no optimizer steps (an EMA of equal weights)


def findings(report: Report, f: UserFacts) -> List[Finding]:
    """Every state finding, at any step (the causes table takes the earliest)."""
    out = [_nonfinite(f), _foreign(f), _start(report, f), _modes(f), lr_finding(f), _hyper(f), _optimizer_state(f),
           *ema.findings(f), _untrained(f)]
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
    if other and not f.nonfinite and _moved(f, [e.name for e in other]):
        worst = max(other, key=lambda e: e.rel)
        return Finding(0, "state", "all tensors", "start-moved",
                       f"at step 0 the stepped weights differ from the reference's ({len(other)} tensor(s), e.g. "
                       f"{worst.name}), alike before the first forward")
    if other and not f.nonfinite:
        worst = max(other, key=lambda e: e.rel)
        return Finding(0, "state", "all tensors", "start-other",
                       f"at step 0 the weights before any update differ from the reference's ({len(other)} "
                       f"tensor(s), e.g. {worst.name} {worst.rel:.3g} rel)",
                       "fn and reference_fn build their models from another seed or in another order (a random "
                       "op between seeding and building on one side, or another init). Fix: seed both sides alike "
                       "right before building the model, or load one state_dict into both.")
    return None


def _hyper(f: UserFacts) -> Optional[Finding]:
    """Another number of param groups, another size of a group, or another weight decay, momentum,
    betas or eps on some rank than in the reference (a group's size only where every rank holds the
    whole model: a pipeline stage's or an expert's optimizer holds its part)."""
    for step, (ranks, ref) in enumerate(zip(f.rank_hyper, f.ref_hyper)):
        for r, groups in enumerate(ranks):
            if len(groups) != len(ref):
                return Finding(step, "state", "a value", "groups",
                               f"at step {step} rank {r}'s optimizer has {len(groups)} param group(s), the reference's "
                               f"{len(ref)}{_groups_apart(groups, ref)}", names=("param groups",))
            for g, (mine, theirs) in enumerate(zip(groups, ref)):
                diff = [k for k in mine if k in theirs and differs(mine[k], theirs[k], SAME_LR)
                        and not (k == "parameters" and f.partial_ranks)]
                if diff:
                    return _hyper_finding(f, step, r, g, diff[0], ranks, mine, theirs)
    return None


def _groups_apart(mine: List[Dict[str, float]], ref: List[Dict[str, float]]) -> str:
    """What sets one side's groups apart, where its groups differ in one option (a weight decay of 0 for
    biases and norms): "; the reference's groups' weight_decay: 0.1, 0 (of 2144 and 166 elements)"."""
    for who, groups in (("the reference's", ref), ("rank 0's", mine)):
        if len(groups) < 2:
            continue
        keys = [k for k in groups[0] if k != "parameters" and len({g.get(k) for g in groups}) > 1]
        if len(keys) == 1:
            values = ", ".join(f"{g[keys[0]]:g}" for g in groups)
            sizes = " and ".join(f"{g['parameters']:g}" for g in groups if "parameters" in g)
            return f"; {who} groups' {keys[0]}: {values}" + (f" (of {sizes} elements)" if sizes else "")
    return ""


def _hyper_finding(f: UserFacts, step: int, r: int, g: int, k: str, ranks: List[List[Dict[str, float]]],
                   mine: Dict[str, float], theirs: Dict[str, float]) -> Finding:
    alone = f.world_size > 1 and any(
        len(o) > g and not differs(o[g].get(k, math.nan), theirs[k], SAME_LR) for o in ranks)
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
            if apart and step == 0 and _started_alike(f, r, apart):
                return Finding(step, "state", "one rank alone", "untrained-forward",
                               f"before step 0 it differs between ranks (rank {r} vs rank 0: {listed(apart)}), alike "
                               "before the first forward", names=tuple(apart))
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


def _moved(f: UserFacts, names: List[str]) -> bool:
    """Rank 0 and the reference held ``names`` alike before their first forward (so what differs at the
    optimizer step was changed in between)."""
    if not f.rank_start or not f.ref_start:
        return False
    mine = {n: f.rank_start[0][n] for n in names if n in f.rank_start[0] and n in f.ref_start}
    return len(mine) == len(names) and not _apart(mine, f.ref_start)


def _started_alike(f: UserFacts, r: int, names: List[str]) -> bool:
    """Rank ``r`` and rank 0 held ``names`` alike before their first forward."""
    if len(f.rank_start) <= r:
        return False
    mine, first = f.rank_start[r], f.rank_start[0]
    return all(n in mine and n in first for n in names) and not _apart({n: mine[n] for n in names}, first)


def _apart(mine: Dict[str, float], theirs: Dict[str, float]) -> List[str]:
    return [n for n, v in mine.items() if n in theirs and math.isfinite(v) and math.isfinite(theirs[n])
            and differs(v, theirs[n], SAME_STATE)]
