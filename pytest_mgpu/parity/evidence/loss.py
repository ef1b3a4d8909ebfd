"""Phase 3, the loss: with the same weights and rows, the ranks' loss (combined as their layout
holds it) against the reference's. A loss off by the world size, its inverse or the number of
backward passes is a loss scaled before backward; a loss off by one exact factor while gradients
and parameters agree is a matter of normalisation, not a divergence (``normalisation``)."""
from __future__ import annotations

import math
from typing import List, Optional, Tuple

from .conditions import passes_at
from .facts import UserFacts
from .inputs import batch_differs
from .finding import Finding, Report, factor_words, listed, over, replica_of

EXACT = 1e-4  # relative: a factor read from the losses of every step alike
SPLIT_SUM = 1e-5  # relative: the ranks' parts of one sequence add up to the reference's loss (roundoff apart)


def findings(report: Report, f: UserFacts) -> List[Finding]:
    out = [_factor(report, f), _outputs(f), _other(report, f)]
    return [x for x in out if x is not None]


def loss_factor(f: UserFacts, step: int) -> float:
    """The ranks' mean loss over the reference's at ``step`` (NaN where either is unknown)."""
    if step >= len(f.rank_losses) or step >= len(f.ref_losses):
        return math.nan
    held = [x for x in f.rank_losses[step] if math.isfinite(x)]
    ref = f.ref_losses[step]
    if not held or not ref or not math.isfinite(ref):
        return math.nan
    return (math.fsum(held) / len(held)) / ref


def _factor(report: Report, f: UserFacts) -> Optional[Finding]:
    """Step 0's loss (same weights on both sides) off by the world size, its inverse, or the backward passes,
    where step 0's gradients differ too: a loss scaled before backward scales them; a loss off by a factor
    beside gradients that agree was counted otherwise (summed over other backward passes), not trained so."""
    if f.world_size < 2 or f.tensor_parallel or f.sequence_split:
        return None  # tensor/sequence-parallel peers hold parts of one loss: no replica mean to scale
    if trained_alike(report, f, 0):
        return None
    k = loss_factor(f, 0)
    if not math.isfinite(k):
        return None
    w, b = f.world_size, f.rank_backwards
    if not (abs(k / w - 1) < 0.02 or abs(k * w - 1) < 0.02 or (b > 1 and abs(k / b - 1) < 0.02)):
        return None
    if (not (b > 1 and abs(k / b - 1) < 0.02) and _grads_contradict(report, f, k)) or \
            (in_passes(f, 0, k) and not _grads_confirm(report, f, k)):
        return None  # a loss scaled before backward scales every gradient alike: these are not
    return Finding(0, "loss", "a uniform factor", "loss-factor",
                   f"at step 0, with the same weights, the ranks' loss is {factor_words(k, w, b)} the reference's",
                   value=k)


def in_passes(f: UserFacts, step: int, k: float) -> bool:
    """The loss ratio ``k`` is the ratio of the backward passes at ``step`` (the reference backpropagates
    each of the W blocks' losses, a rank its own): the same per-pass losses, summed over more passes."""
    ranks = f.rank_step_backwards[step] if step < len(f.rank_step_backwards) else []
    ref = f.ref_step_backwards[step] if step < len(f.ref_step_backwards) else 0
    if not ranks or not ref or not all(ranks) or not math.isfinite(k) or ref == ranks[0]:
        return False
    return abs(k / (sum(ranks) / len(ranks) / ref) - 1) < EXACT


def _fewer_passes(f: UserFacts, step: int) -> bool:
    """The ranks backpropagated fewer passes at ``step`` than the reference (its W blocks, a rank its own):
    a loss that is the ratio of the passes (``in_passes``) is then the same per pass, whatever clipping
    or a scaler then did to the gradients. (More passes on the ranks summing to more is the signature
    of an accumulation not divided, which the gradients must tell apart.)"""
    mine, ref = passes_at(f, step)
    return 0 < mine < ref


def _grads_contradict(report: Report, f: UserFacts, k: float, step: int = 0) -> bool:
    """The step's gradients were compared and they are not ``k`` x the reference's in every tensor (times
    what each side's clipping scaled them by): a loss scaled by ``k`` before backward would have scaled
    them all so (the reference then sums other backward passes' losses into its step: counted otherwise)."""
    ratios, expect = _grad_ratios(report, step), k * _clipped(f, step)
    if len(ratios) < 2 or not expect:
        return False
    return not all(abs(r / expect - 1) < 0.02 for r in ratios)


def _grads_confirm(report: Report, f: UserFacts, k: float) -> bool:
    """Step 0's gradients were compared and every one is ``k`` x the reference's (times the clipping's)."""
    ratios, expect = _grad_ratios(report, 0), k * _clipped(f, 0)
    return bool(ratios) and bool(expect) and all(abs(r / expect - 1) < 0.02 for r in ratios)


def _clipped(f: UserFacts, step: int) -> float:
    """What rank 0's clipping scaled its gradients by at ``step`` over what the reference's did (1: none)."""
    mine = f.rank_clips[step][0] if step < len(f.rank_clips) and f.rank_clips[step] else []
    ref = f.ref_clips[step] if step < len(f.ref_clips) else []
    return math.prod(c for c in mine if math.isfinite(c)) / math.prod(c for c in ref if math.isfinite(c) and c > 0)


def _grad_ratios(report: Report, step: int) -> List[float]:
    """||ranks|| / ||reference|| of every gradient compared at ``step`` (none where not compared)."""
    return [e.norm_ratio for e in report.records[step].errors if e.kind == "grad" and e.norm_ref > 0
            and math.isfinite(e.norm_ratio) and not e.missing] if step < len(report.records) else []


def trained_alike(report: Report, f: UserFacts, step: int) -> bool:
    """At ``step`` the gradients were compared and agree, and so do the norms clipped: a loss that differs
    there was counted otherwise (summed over other backward passes), not trained so."""
    grads = [e for e in report.records[step].errors if e.kind == "grad"] if step < len(report.records) else []
    norms = f.rank_clip_norms[step] if step < len(f.rank_clip_norms) else []
    ref = f.ref_clip_norms[step] if step < len(f.ref_clip_norms) else []
    return bool(grads) and not over(report, step, "grad") and all(b and abs(a / b - 1) < 1e-3 for a, b in zip(norms, ref))


def counted_otherwise(report: Report, f: UserFacts, step: int) -> bool:
    """At ``step`` only the loss is over the line and the step trained alike (``trained_alike``): the
    divergence, as far as training goes, starts later."""
    failing = {e.kind for e in report.records[step].errors if not report.tolerance.passes(e, step)} \
        if step < len(report.records) else set()
    return bool(failing) and failing <= {"loss"} and trained_alike(report, f, step)


def _outputs(f: UserFacts) -> Optional[Finding]:
    order = f.output_order
    if not order or order == sorted(order):
        return None
    moved = [f"row {i} is reference row {j}" for i, j in enumerate(order) if i != j][:3]
    return Finding(0, "loss", "certain rows", "output-order",
                   f"at step 0 the output rows are the reference's in another order ({'; '.join(moved)}, ...)")


def _other(report: Report, f: UserFacts) -> Optional[Finding]:
    """The loss differs at a step whose weights agree: another batch, BatchNorm or dropout, another loss."""
    for step in range(len(report.records)):
        if over(report, step, "param"):
            return None  # the weights differ first: the state or an update explains it
        bad = over(report, step, "loss") + over(report, step, "output")
        k = loss_factor(f, step)
        if f.sequence_split and math.isfinite(k) and any(abs(k * t - 1) < SPLIT_SUM for t in (f.sequence_split, 1)):
            continue  # the parts' losses add up to the reference's (a sum over the sequence's parts) or average to it
        passes = in_passes(f, step, k) and (_fewer_passes(f, step) or _grads_contradict(report, f, k, step)
                                            or not _grad_ratios(report, step))
        if bad and not trained_alike(report, f, step) and not passes and not batch_differs(f, step):
            shown = "" if not math.isfinite(k) else f" ({k:.4g}x the reference's)" if abs(k - 1) >= 5e-4 else \
                f" (by {abs(k - 1):.2g} of it)"  # "1x the reference's" would read as no difference
            split = term_split(report, step)
            last = last_module(f)
            if split and last and not any(n == last or n.startswith(last + ".") for n in split[0]):
                return Finding(step, "loss", "some modules", "loss-term", f"at step {step} the weights agree, the loss "
                               f"differs{shown} and only {listed(split[0], 3)}'s gradients differ ("
                               f"{listed(split[1], 3)}'s agree)", value=k, names=tuple(split[0]))
            if not _rows_seen(f, step):
                return Finding(step, "loss", "all tensors", "loss-other", f"at step {step} the weights agree "
                               f"but the loss differs{shown}; the rows {_unseen(f, step)} fed were not recorded",
                               value=k, names=("rows-unseen",))
            return Finding(step, "loss", "all tensors", "loss-other",
                           f"at step {step} the weights agree but the loss differs{shown}", value=k)
    return None


def _rows_seen(f: UserFacts, step: int) -> bool:
    """Both sides' input rows were recorded at ``step`` (so "the same rows" is a fact there)."""
    ref = f.ref_rows[step] if step < len(f.ref_rows) else []
    ranks = f.rank_rows[step] if step < len(f.rank_rows) else []
    return bool(ref) and bool(ranks) and all(ranks)


def _unseen(f: UserFacts, step: int) -> str:
    ref = f.ref_rows[step] if step < len(f.ref_rows) else []
    ranks = f.rank_rows[step] if step < len(f.rank_rows) else []
    return "both sides" if not ref and not any(ranks) else "the ranks" if ref else "reference_fn"


def last_module(f: UserFacts) -> str:
    """The name of the last module whose call ended in the reference's first probed forward (the one
    nearest the model's output); "" where no trail was kept."""
    for q in f.ref_probes:
        ended = [m.name for m in getattr(q, "trail", None) or [] if m.key[2] == "output" and m.name]
        if ended:
            return ended[-1]
    return ""


def term_split(report: Report, step: int, depth: int = 3) -> Optional[Tuple[List[str], List[str]]]:
    """(parts whose gradients differ, parts whose nonzero gradients agree) at ``step``, parts named by
    the first 1..``depth`` components of the parameters' names, at the coarsest level where no part holds
    both; None where every gradient differs or none does. A loss term that reads one part's output or
    weights alone (a KL or auxiliary term, a penalty) reaches that part only: the caller also asks that
    the module nearest the output (``last_module``) be among the parts that agree."""
    errs = [e for e in report.records[step].errors if e.kind == "grad" and replica_of(e) is None and not e.missing]
    bad = {e.name for e in over(report, step, "grad", replicas=False)}
    good = [e.name for e in errs if e.name not in bad and e.norm_ref > 0]
    if not bad or not good:
        return None
    for d in range(1, depth + 1):
        part = lambda n: ".".join(n.split(".")[:d])  # noqa: E731
        off, on = list(dict.fromkeys(part(n) for n in sorted(bad))), list(dict.fromkeys(part(n) for n in good))
        if not set(off) & set(on):
            return off, on
    return None


def normalisation(report: Report, f: UserFacts) -> Optional[float]:
    """The factor the loss differs by at every step while nothing else does (gradients, parameters
    and the norms clipped agree): a loss normalised otherwise (e.g. summed over a tensor-parallel
    group), which trains alike. None where that is not the case."""
    failing = {e.kind for _, e, _ in report.failures()}
    if failing != {"loss"} or any(abs(a / b - 1) > 1e-3 for n, m in zip(f.rank_clip_norms, f.ref_clip_norms)
                                  for a, b in zip(n, m) if b):
        return None
    ks = [loss_factor(f, s) for s in range(len(report.records))]
    if not ks or not all(math.isfinite(k) and k != 0 for k in ks):
        return None
    return ks[0] if all(abs(k / ks[0] - 1) < EXACT for k in ks) and abs(ks[0] - 1) > 1e-3 else None
