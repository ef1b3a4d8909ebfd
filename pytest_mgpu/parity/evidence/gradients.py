"""Phases 4 and 5, the gradients: before clipping (the total norms each side's
``clip_grad_norm_`` saw, what backward and the synchronisation left) and as the optimizer was given
them. Between ranks that should agree (replicas not synchronised, or only some modules), against
the reference (one factor for every tensor, one for some modules only, the level a lower precision
rounds at), a step's gradients holding the previous step's (no ``zero_grad``), and a clipping that
scales by another factor."""
from __future__ import annotations

import math
import statistics
from typing import Dict, List, Optional, Tuple

from ..judge.tolerance import EPS
from ..record.recorder import SideLog
from ..records import TensorError
from . import clip_order
from .conditions import passes_at
from .facts import REFERENCE, UserFacts
from .finding import (Finding, Report, common_factor, factor_words, listed, modules_of, over, plain_name, replica_of,
                      world_factor_of_most)

SAME_CLIP = 1e-2  # relative: a clip factor from the same norm, up to the sides' roundoff


def findings(report: Report, f: UserFacts) -> List[Finding]:
    out = [_zeroed(f), _carried(f), *clip_order.findings(report, f), _clipping(report, f), _replicas(report, f),
           _against_reference(report, f), *_stages(report, f)]
    return [x for x in out if x is not None]


# -- between ranks --------------------------------------------------------------------------------
def _replicas(report: Report, f: UserFacts) -> Optional[Finding]:
    """The first step whose gradients differ between ranks that should hold the same ones."""
    if f.tp_inputs_differ:
        return None  # tensor parallel with rank-dependent inputs: the rows are the evidence
    for step in range(len(report.records)):
        bad = over(report, step, "grad", replicas=True)
        if not bad:
            continue
        ranks = sorted({r for e in bad if (r := replica_of(e)) is not None})
        names = [plain_name(e) for e in bad]
        every = {plain_name(e) for e in report.records[step].errors if e.kind == "grad" and replica_of(e) is not None}
        worst = max(bad, key=lambda e: e.rel)
        some = len(set(names)) < len(every)
        where = (f"at step {step} the gradients the optimizer was given differ between ranks (rank "
                 f"{', '.join(map(str, ranks))} vs rank 0: {len(set(names))} of {len(every)} tensor(s)"
                 + (f", only in {listed(modules_of(names))}" if some else "") +
                 f", e.g. {plain_name(worst)} {worst.rel:.3g} rel)")
        signal = "grads-tp-unreduced" if f.tensor_parallel else "grads-unsynced"
        replicas = dp_groups(f)
        if replicas and not set(ranks) & set(f.data_groups[0]):  # rank 0's peers agree: its replicas differ
            signal = "grads-dp-unreduced"
            where += "; data-parallel groups: " + "; ".join("ranks " + ", ".join(map(str, g)) for g in replicas)
        return Finding(step, "gradients", "some modules" if some else "one rank alone", signal, where,
                       names=tuple(modules_of(names)) if some else tuple(map(str, ranks)))
    return None


def dp_groups(f: UserFacts) -> List[List[int]]:
    """The data-parallel groups of a 2-D layout: the ranks at one place of every tensor-parallel group
    (they hold the same shards), where there are several such groups of one size; [] otherwise."""
    groups = f.data_groups
    if not f.tensor_parallel or len(groups) < 2 or len({len(g) for g in groups}) != 1 or len(groups[0]) < 2:
        return []
    return [[g[i] for g in groups] for i in range(len(groups[0]))]


# -- against the reference ------------------------------------------------------------------------
def _against_reference(report: Report, f: UserFacts) -> Optional[Finding]:
    """The first step whose gradients differ from the reference's, while its weights did not: by one
    factor, in some modules only, or at the level of a lower precision."""
    for step in range(len(report.records)):
        if over(report, step, "param"):
            return None  # the weights differ first: the state or an update explains the gradients
        bad = over(report, step, "grad", replicas=False)
        if not bad:
            continue
        errs = [e for e in report.records[step].errors if e.kind == "grad" and replica_of(e) is None
                and not e.missing and e.norm_ref > 0 and math.isfinite(e.norm_ratio)]
        k = common_factor([e.norm_ratio for e in errs])
        w, b = f.world_size, f.rank_backwards
        if k != 1.0:
            return Finding(step, "gradients", "a uniform factor", "grads-factor",
                           f"at step {step}, with the same weights, every gradient is {factor_words(k, w, b)} the "
                           f"reference's, in all {len(errs)} tensors{_when(f, step, k)}", value=k)
        return _partial(step, bad, errs, f)
    return None


def _when(f: UserFacts, step: int, k: float) -> str:
    """Whether backward already left the factor (in the loss, a reduction inside backward such as a
    communication hook) or it came after backward, before the step (a hand-written all_reduce or
    scaling), read from the total norms backward left on rank 0 and in the reference."""
    raws = f.rank_raw[step] if step < len(f.rank_raw) else []
    mine = raws[0] if raws else math.nan
    ref = f.ref_raw[step] if step < len(f.ref_raw) else math.nan
    if not (math.isfinite(mine) and math.isfinite(ref) and ref > 0):
        return ""
    if all(math.isfinite(r) for r in raws) and any(abs(r - mine) > 1e-6 * mine for r in raws):
        return "; backward left each rank its own shard's gradients, so the factor came from the reduction after it"
    raw = mine / ref
    if abs(raw / k - 1) < 0.02:
        return "; backward already left them so (the loss, or a reduction inside backward such as a comm hook)"
    if abs(raw - 1) < 0.02:
        return "; backward left them as the reference's, so the factor came after it, before the optimizer step"
    return ""


def _partial(step: int, bad: List[TensorError], errs: List[TensorError], f: UserFacts) -> Finding:
    """Some modules' gradients differ (with their own factor where they share one), or every one at
    the level a lower precision rounds at."""
    names = [e.name for e in bad]
    total = max(len(errs), len(bad))  # a tensor whose reference gradient is zero has no ratio, but counts
    mods = modules_of(names)
    all_mods = modules_of([e.name for e in errs])
    ratios = [e.norm_ratio for e in bad if e.norm_ref > 0 and math.isfinite(e.norm_ratio) and not e.missing]
    k = common_factor(ratios) if len(ratios) > 1 else (ratios[0] if ratios and abs(ratios[0] - 1) > 0.05 else 1.0)
    worst = max(bad, key=lambda e: e.rel)
    level = _precision(bad, f)
    if level:
        return Finding(step, "gradients", "all tensors", "grads-precision",
                       f"at step {step} the gradients differ from the reference's at the {level} level "
                       f"({worst.rel:.2g} rel at most, {level}'s eps {EPS[level]:.2g})"
                       + (f": {f.reduced_by} rounds them" if f.reduced_by else ""), names=(level,))
    most = world_factor_of_most(ratios, f.world_size) if k == 1.0 and f.hand_sharded else 0
    k = float(f.world_size) if most else k
    if len(mods) < len(all_mods) or k != 1.0:  # some tensors only, or only those by one factor
        by = f", all by {factor_words(k, f.world_size, f.rank_backwards)}" if k != 1.0 else ""
        by = f", {most} of them by {factor_words(k, f.world_size)}" if most else by
        missing = [e.name for e in bad if e.missing]
        whole = bool(f.hand_sharded) and not any(n in f.hand_sharded for n in names) and not f.experts_by_rows \
            and f.world_size > 1 and abs(k / f.world_size - 1) < 0.02  # tensors held whole, by the peers' count
        return Finding(step, "gradients", "some modules", "grads-whole" if whole else "grads-modules",
                       f"at step {step}, with the same weights, only the gradients of {listed(mods)} differ from the "
                       f"reference's ({len(bad)} of {total} tensors{by}; e.g. {worst.name} {worst.rel:.3g} rel"
                       + (f"; no gradient for {listed(missing)}" if missing else "") + ")",
                       value=k, names=tuple(mods))
    return Finding(step, "gradients", "all tensors", "grads-other",
                   f"at step {step}, with the same weights, the gradients differ from the reference's ({len(bad)} of "
                   f"{total} tensors, e.g. {worst.name} {worst.rel:.3g} rel)")


def _precision(bad: List[TensorError], f: UserFacts) -> str:
    """The lower precision every differing gradient sits at (relative error between 1/64 and 4 of
    its eps), where the ranks reduce or compute in one; "" otherwise."""
    level = f.reduce_dtype or (f.dtype if f.dtype in ("bfloat16", "float16") else "")
    if not level or level not in EPS:
        return ""
    eps = EPS[level]
    return level if all(eps / 64 <= e.rel <= 4 * eps for e in bad) else ""


# -- zero_grad ------------------------------------------------------------------------------------
def _zeroed(f: UserFacts) -> Optional[Finding]:
    """Gradients zeroed between the backward passes of one step on the ranks only (observed before
    each pass): each micro-batch's gradient replaced the previous one's instead of adding to it."""
    for step, (mine, theirs) in enumerate(zip(f.rank_zeroed, f.ref_zeroed)):
        extra, missing = [p for p in mine if p not in theirs], [p for p in theirs if p not in mine]
        also = f" (the reference's too before pass {', '.join(map(str, theirs))}: a step it did not count)" \
            if theirs else ""  # a GradScaler's skipped update: its passes belong to the next step
        if missing and not extra and _same_passes(f, step):
            return Finding(step, "gradients", "a value", "grads-kept-between",
                           f"at step {step} reference_fn's gradients were zero again before backward pass "
                           f"{', '.join(map(str, missing))} of {f.ref_step_backwards[step]}, fn's on the ranks "
                           f"{'never' if not mine else 'not there'}: each pass's gradients added to the previous pass's")
        if not extra or missing:
            continue  # a reference that zeroes between its passes keeps its gradient elsewhere (not compared)
        return Finding(step, "gradients", "a value", "grads-zeroed-micro",
                       f"at step {step} every gradient of fn on the ranks was zero again before backward pass "
                       f"{', '.join(map(str, extra))}{also}: each micro-batch's gradients replaced the previous ones'")
    return None



def _same_passes(f: UserFacts, step: int) -> bool:
    """Rank 0 and the reference backpropagated as many losses at ``step`` (more than one)."""
    mine, ref = passes_at(f, step)
    return ref > 1 and mine == ref


def carried_over(rank: SideLog, ref: SideLog) -> str:
    """The first side and step whose gradients are the other side's plus its own previous step's:
    gradients never zeroed between steps ("" where none)."""
    import torch

    names = sorted(set(rank.steps[0].grads) & set(ref.steps[0].grads)) if rank.steps and ref.steps else []

    def flat(grads) -> "torch.Tensor":  # the tensors both sides hold (a pipeline stage holds its part)
        ts = [grads[n].double().reshape(-1) for n in names if grads.get(n) is not None]
        return torch.cat(ts) if ts else torch.zeros(0, dtype=torch.float64)

    for step in range(1, min(len(rank.steps), len(ref.steps))):
        mine, theirs = flat(rank.steps[step].grads), flat(ref.steps[step].grads)
        if mine.shape != theirs.shape or mine.numel() == 0 or not bool(torch.isfinite(torch.cat([mine, theirs])).all()):
            return ""
        gap = float((mine - theirs).norm())
        if gap <= 1e-3 * float(theirs.norm()):
            continue
        for who, side, now, other in (("fn on the ranks", rank, mine, theirs), (REFERENCE, ref, theirs, mine)):
            before = flat(side.steps[step - 1].grads)
            if before.shape == now.shape and _sum_of(now, before, other, gap):
                return f"{who} at step {step}"
        return ""
    return ""


def _sum_of(now, before, other, gap: float) -> bool:
    """``now`` = a * ``before`` + b * ``other`` with a > 0, to 5% of the sides' gap."""
    import torch

    basis = torch.stack([before, other], dim=1)
    coef = torch.linalg.lstsq(basis, now.unsqueeze(1)).solution.squeeze(1)
    rest = float((now - basis @ coef).norm())
    return float(coef[0]) > 0.05 and rest < 0.05 * gap


def _carried(f: UserFacts) -> Optional[Finding]:
    if not f.carried:
        return None
    who, step = f.carried.rsplit(" at step ", 1)
    return Finding(int(step), "gradients", "all tensors", "grads-carried",
                   f"at step {step} the gradients of {who} are the other side's plus its own of step {int(step) - 1}")


# -- clipping -------------------------------------------------------------------------------------
def _clipping(report: Report, f: UserFacts) -> Optional[Finding]:
    """The first step at which the sides' gradient clipping scaled by other factors and the
    gradients the optimizer was given differ; ranks whose norms before clipping already differ were
    not synchronised before it (``_replicas`` says so), not clipped apart."""
    for step, (ranks, ref) in enumerate(zip(f.rank_clips, f.ref_clips)):
        moved = bool(over(report, step, "grad"))
        mine = ranks[0] if ranks else []
        if bool(mine) != bool(ref):
            some, every = _replicas_apart(report, step)
            if some or not (every or not _backward_differs(f, step) or _clip_explains(report, step)):
                continue  # the gradients differ otherwise too: the clip's factor follows from them (its norm)
            by_hand = _by_hand(f, step, ref) if moved and ref else None
            if by_hand is not None:
                return by_hand
            one = mine or ref
            if moved and one and math.isfinite(one[0]) and one[0] < 1 and not (ref and clip_order.clipped_next(f, step)):
                who, other = ("fn on the ranks", REFERENCE) if mine else (REFERENCE, "fn on the ranks")
                return Finding(step, "gradients", "a value", "clip-one-side",
                               f"at step {step} {who} clipped its gradients by a factor of {one[0]:.4g} "
                               f"(clip_grad_norm_), and no clipping call was seen in {other}")
            continue
        if not mine or not (math.isfinite(mine[0]) and math.isfinite(ref[0])):
            continue
        if moved and len(mine) > 1 and len(ref) == 1 and all(len(r) == len(mine) for r in ranks):
            return Finding(step, "gradients", "a value", "clip-per-tensor", f"at step {step} the ranks called "
                           f"clip_grad_norm_ {len(mine)} times, the reference once")
        per_rank = [r[0] if r else 1.0 for r in ranks]  # a rank that did not clip scaled by 1
        off = any(abs(a - per_rank[0]) > SAME_CLIP * max(a, per_rank[0]) for a in per_rank)
        norms = f.rank_first_norms[step] if step < len(f.rank_first_norms) else []
        unsynced = all(math.isfinite(n) for n in norms) and any(abs(n - norms[0]) > 1e-6 * abs(norms[0]) for n in norms) \
            and bool(over(report, step, "grad", replicas=True))  # sharded ranks clip norms of their own shards
        if off and (unsynced or not moved):
            continue
        if not off and abs(mine[0] - ref[0]) <= SAME_CLIP * max(mine[0], ref[0]):
            continue
        return _clip_finding(f, step, per_rank, ref[0], off)
    return None


def _clip_explains(report: Report, step: int) -> bool:
    """A scaling can be the whole difference of the gradients the optimizer was given: every one that
    differs does so by one factor (a clip on one side, or by hand with another norm). Gradients apart by
    no common factor differ before any clip, and a clip's factor follows from their norm."""
    ratios = [e.norm_ratio for e in over(report, step, "grad", replicas=False) if not e.missing and e.scale > 0]
    return len(ratios) < 2 or common_factor(ratios) != 1.0


def _backward_differs(f: UserFacts, step: int) -> bool:
    """The total gradient norm rank 0's last backward left is not the reference's (before any clip), both
    known: the difference began in the backward. Unknown (a DTensor's shards) or the same: it may have come
    after it (a clip by value, or of each rank's own shards)."""
    mine = f.rank_raw[step][0] if step < len(f.rank_raw) and f.rank_raw[step] else math.nan
    ref = f.ref_raw[step] if step < len(f.ref_raw) else math.nan
    return math.isfinite(mine) and math.isfinite(ref) and abs(mine - ref) > 1e-3 * max(abs(ref), 1e-30)


def _replicas_apart(report: Report, step: int) -> Tuple[bool, bool]:
    """(some, every): replicas' gradients apart in some tensors while the others agree (those were not
    synchronised, before any clip: ``_replicas`` says so), or apart in every tensor (a clip of each rank's
    own shard, or by its own norm, may be why: each rank scales what it owns)."""
    apart = over(report, step, "grad", replicas=True)
    every = [e for e in report.records[step].errors if e.kind == "grad" and replica_of(e) is not None] \
        if step < len(report.records) else []
    return bool(apart) and len(apart) < len(every), bool(apart) and len(apart) == len(every)


def _by_hand(f: UserFacts, step: int, ref: List[float]) -> Optional[Finding]:
    """The reference clipped with clip_grad_norm_; the ranks made no call, but the gradients rank 0's
    optimizer was given are a fraction of those its backward left (no GradScaler between): clipped by
    hand, with a total norm that is not the reference's."""
    c = f.rank_scaled[step] if step < len(f.rank_scaled) else math.nan
    scaler = step < len(f.rank_scaler) and any(s and math.isfinite(s[0]) for s in f.rank_scaler[step])
    if scaler or not math.isfinite(c) or not 1e-3 < c < 1 - 1e-4 or not math.isfinite(ref[0]):
        return None
    return Finding(step, "gradients", "a uniform factor", "clip-by-hand",
                   f"at step {step} the reference's clip_grad_norm_ scaled its gradients by {ref[0]:.4g}, the ranks' "
                   f"own code by {c:.4g}: a norm {ref[0] / c:.4g}x the reference's total",
                   value=ref[0] / c)


def _clip_finding(f: UserFacts, step: int, per_rank: List[float], ref: float, off: bool) -> Finding:
    norms = f.rank_clip_norms[step] if step < len(f.rank_clip_norms) else []
    ref_norms = f.ref_clip_norms[step] if step < len(f.ref_clip_norms) else []
    head = (f"at step {step} the reference clipped its gradients by a factor of {ref:.4g}, the ranks by "
            f"{', '.join(f'{x:.4g}' for x in per_rank)} (rank 0 first)")
    if off:
        return Finding(step, "gradients", "one rank alone", "clip-ranks", head + ": the ranks clipped by different factors")
    ratio = norms[0] / ref_norms[0] if norms and ref_norms and ref_norms[0] > 0 and math.isfinite(norms[0]) else math.nan
    if not math.isfinite(ratio):
        return Finding(step, "gradients", "a value", "clip-passes-on", head)
    return Finding(step, "gradients", "a uniform factor", "clip-norm",
                   head + f"; total norms before clipping {norms[0]:.4g} on rank 0 against {ref_norms[0]:.4g}: "
                   f"{factor_words(ratio, f.world_size, f.rank_backwards)}", value=ratio)


# -- pipeline stages (assert_parity of the user's own module) -------------------------------------
def _stages(report: Report, f: UserFacts) -> List[Finding]:
    if not f.stage_of or not report.records:
        return []
    by_stage: Dict[str, List[TensorError]] = {}
    for e in report.records[0].errors:
        if e.kind == "grad" and e.name in f.stage_of:
            by_stage.setdefault(f.stage_of[e.name], []).append(e)
    healthy = [s for s, es in by_stage.items() if _stage_ratio(es) > 0.95]
    out = []
    for stage, errs in by_stage.items():
        ratio = _stage_ratio(errs)
        if all(e.missing == "strategy" for e in errs):
            out.append(Finding(0, "gradients", "some modules", "stage-cut",
                               f"stage {stage!r} gets no gradient: none of its {len(errs)} parameters has a .grad "
                               "after backward (the reference's do)", names=(stage,)))
        elif healthy and stage not in healthy and 0 < ratio < 0.9:
            out.append(Finding(0, "gradients", "some modules", "stage-part",
                               f"stage {stage!r}'s gradients are {ratio:.3g}x the reference's at step 0 while stage(s) "
                               f"{', '.join(healthy)} match", value=ratio, names=(stage,)))
    return out


def _stage_ratio(errors: List[TensorError]) -> float:
    ratios = [0.0 if e.missing == "strategy" else e.norm_ratio for e in errors
              if e.norm_ref > 0 and math.isfinite(e.norm_ratio)]
    return statistics.median(ratios) if ratios else 1.0
