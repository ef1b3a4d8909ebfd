"""Turning a parity run into words: the per-step summary, the divergence table, and the likely
causes, each hint triggered by a fact that rank 0 observed (never guessed from the errors alone,
except the constant gradient ratio, which is itself an observation)."""
from __future__ import annotations

import math
from typing import Callable, Final, List, Tuple

from tabulate import tabulate

from ...brief import cited, fit

from .numbers import Report, common_factor, number_hints
from .loops import loop_hints
from ..records import KINDS, RunFacts, TensorError
from ..judge.tolerance import DATA_PARALLEL

WORST_ROWS = 10


def _names(names: List[str], limit: int = 4) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f", ... ({len(names)} in all)" if len(names) > limit else "")


def _e(x: float) -> str:
    if x == 0:
        return "0"
    if math.isinf(x) or math.isnan(x):
        return str(x)
    return f"{x:.2e}"


def summary_table(report: Report) -> str:
    """One row per step: the worst norm-wise relative error of each kind, the float64 floor, the
    line, and how far along it the step's worst tensor is (what is judged)."""
    kinds = [k for k in KINDS if any(e.kind == k for r in report.records for e in r.errors)]
    measured = report.tolerance.rule == "measured"
    rows = []
    bad_steps = {s for s, _, _ in report.failures()}
    for rec, line in zip(report.records, report.lines()):
        row = [rec.step]
        for k in kinds:
            errs = [e for e in rec.errors if e.kind == k]
            row.append(_e(max(e.rel for e in errs)) if errs else "-")
        if measured:
            row.append(_e(line.floor) if line.floor is not None else "-")
        worst = f"{line.ratio:.3g}" if math.isfinite(line.ratio) else "inf"
        if line.worst is not None and line.ratio > 0:
            worst += f" ({line.worst.kind} {line.worst.name})"
        row += [_e(line.line), worst, "DIVERGED" if rec.step in bad_steps else "ok"]
        rows.append(row)
    headers = ["step"] + [f"{k} rel err" for k in kinds] + (["floor"] if measured else [])
    headers += ["line", "worst / line", ""]
    return tabulate(rows, headers=headers, tablefmt="simple")


def divergence_table(report: Report) -> str:
    """The first diverging step's worst tensors, worst first (by error / tolerance)."""
    failures = report.failures()
    if not failures:
        return ""
    first = failures[0][0]
    rows = [(e, bound) for s, e, bound in failures if s == first]
    rows.sort(key=lambda r: report.tolerance.ratio(r[0], first), reverse=True)
    table = []
    for e, bound in rows[:WORST_ROWS]:
        name = e.name + (f" (the strategy's has {e.missing})" if e.missing.startswith("shape")
                         else f" (missing in {e.missing})" if e.missing else "")
        tol = bound / e.norm_ref if e.norm_ref > 0 else bound
        table.append([first, e.kind, name, "x".join(map(str, e.shape)) or "scalar", _e(e.max_abs),
                      _e(e.max_rel), _e(e.rel), _e(tol), f"{report.tolerance.ratio(e, first):.3g}"])
    more = f"\n... and {len(rows) - WORST_ROWS} more tensor(s) over tolerance at step {first}" \
        if len(rows) > WORST_ROWS else ""
    return tabulate(table, headers=["step", "kind", "name", "shape", "max abs err", "max rel err",
                                    "norm rel err", "tolerance", "err / line"], tablefmt="simple") + more


def _grad_scale(errors: List[TensorError]) -> float:
    """The common ||strategy grad|| / ||reference grad|| when every gradient is off by one factor."""
    return common_factor([e.norm_ratio for e in errors if e.kind == "grad" and not e.missing and e.scale > 0
                          and math.isfinite(e.norm_ratio)])


def _splits_batch(f: RunFacts) -> bool:
    return (f.strategy.split("/")[0] in DATA_PARALLEL and f.world_size > 1) or f.microbatches > 1


def _batchnorm(report: Report) -> str:
    f = report.facts
    if not (f.batchnorm and _splits_batch(f)):
        return ""
    how = (f"{f.microbatches} micro-batches" if f.microbatches > 1 else f"the {f.world_size} shards")
    if f.microbatches > 1:
        fix = "BatchNorm cannot see across micro-batches: compare in eval() mode, or use GroupNorm/LayerNorm"
    elif f.strategy.split("/")[0] == "dp":
        fix = ("DataParallel replicas cannot share statistics: use DDP with SyncBatchNorm, or compare "
               "in eval() mode")
    else:
        fix = ("convert with torch.nn.SyncBatchNorm.convert_sync_batchnorm (sync_bn=True for ddp) so "
               "statistics cover the global batch")
    return (f"BatchNorm without SyncBatchNorm: {len(f.batchnorm)} BatchNorm module(s) in training mode "
            f"({_names(f.batchnorm)}) normalize each of {how} with its own mean and variance, not the "
            f"global batch's. Fix: {fix}.")


def _dropout(report: Report) -> str:
    f = report.facts
    if not f.dropout:
        return ""
    return (f"Dropout or other randomness: {len(f.dropout)} active dropout module(s) ({_names(f.dropout)}) "
            "draw different masks for a shard than for the global batch. Put the model in eval() or "
            "set p=0 for the parity check.")


def _sharded(f: RunFacts) -> bool:
    """DDP or FSDP over several ranks: the gradients are averaged over shards."""
    return f.strategy.split("/")[0] in ("ddp", "fsdp") and f.world_size > 1


def _scaling(report: Report) -> str:
    f = report.facts
    scale = _grad_scale([e for r in report.records[:1] for e in r.errors])
    if _sharded(f) and (f.loss_reduction == "sum" or scale != 1.0):
        seen = f" (gradients are {scale:.3g}x the reference's" + \
            (f"; 1/{f.world_size} = {1 / f.world_size:.3g})" if abs(scale * f.world_size - 1) < 0.05 else ")") \
            if scale != 1.0 else ""
        return (f"loss reduction='sum' under DDP averaging{seen}: DDP and FSDP divide the summed gradients "
                f"by the world size ({f.world_size}), which equals the global-batch gradient only for a "
                "per-rank mean loss. Use reduction='mean', or scale the loss by the world size.")
    if scale != 1.0:
        return f"every gradient is {scale:.3g}x the reference's: a loss scaling or averaging mismatch."
    return ""


def _uneven_shards(report: Report) -> str:
    f = report.facts
    uneven = sorted({b for b in f.batch_sizes if b % max(1, f.world_size) != 0})
    if not (_sharded(f) and uneven):
        return ""
    return (f"global batch not divisible by the world size: batch {uneven[0]} on {f.world_size} ranks; "
            f"DistributedSampler pads the shards to {f.shard_sizes} by repeating samples, so some "
            "samples count twice. Use a batch divisible by the world size (or drop_last=True).")


def _uneven_microbatches(report: Report) -> str:
    f = report.facts
    uneven = sorted({b for b in f.batch_sizes if f.microbatches > 1 and b % f.microbatches})
    if not uneven:
        return ""
    return (f"batch {uneven[0]} does not split into {f.microbatches} equal micro-batches: the mean "
            "of micro-batch means weights samples unequally. Use a divisible batch.")


def _unused(report: Report) -> str:
    f = report.facts
    if not f.unused:
        return ""
    return (f"unused parameters: {len(f.unused)} parameter(s) get no gradient ({_names(f.unused)}). "
            "DDP needs find_unused_parameters=True for them; compare them only if the model uses them.")


def _low_precision(report: Report) -> str:
    f = report.facts
    if not (report.tolerance.rule == "derived" and f.dtype in ("float16", "bfloat16", "tf32")):
        return ""
    return (f"{f.dtype} arithmetic: if the errors are just above the tolerance and grow slowly, they "
            "are rounding; pass rtol=/atol= (the tolerance source above says how it was derived).")


def _bitwise(report: Report) -> str:
    return f"bitwise equality was demanded (deterministic=True): {report.facts.exact_note}." if report.exact else ""


# Each reads one fact that rank 0 observed (or the constant gradient ratio) and says "" when it
# does not apply; listed in the order the message gives them.
FACT_HINTS: Final[Tuple[Callable[[Report], str], ...]] = (
    _batchnorm, _dropout, _scaling, _uneven_shards, _uneven_microbatches, _unused, _low_precision, _bitwise)
NO_CAUSE: Final = ("no known cause detected: look for rank-dependent code, non-deterministic kernels, or "
                   "state kept between steps; rerun with steps=1 to see if the first step already diverges.")


START_APART: Final = "the ranks start from different weights"
REPLICA_CAUSES: Final = ("one rank's update differs", "gradients are not synchronized between ranks")
# The generic words for gradients off by one factor: left out where a loop hint names the factor's cause.
GENERIC_FACTOR: Final = ("every gradient is ", "gradients scaled by a constant", "loss reduction='sum'")


def _replicas_first(report: Report) -> bool:
    """Replicas (rows ``rank r: <name>``) fail at the first diverging step: the earliest evidence."""
    failures = report.failures()
    return bool(failures) and any(s == failures[0][0] and e.name.startswith("rank ") for s, e, _ in failures)


def likely_causes(report: Report) -> List[str]:
    """The user's own training loops first (what their loops were seen doing: the most specific
    evidence), then hints read from the numbers, then the facts of the strategy."""
    loop = loop_hints(report)
    numbers = number_hints(report)
    # Ranks that should be equal and are not, at the first step that diverges: the evidence sits in one
    # phase of that step (the weights before any update, one rank's update, the synchronized
    # gradients), and whatever else differs follows from it, so it is said first.
    first = [h for h in numbers if h.startswith(START_APART) or (h.startswith(REPLICA_CAUSES) and _replicas_first(report))]
    hints = first + loop + [h for h in numbers if h not in first] + [h for h in (hint(report) for hint in FACT_HINTS) if h]
    if any(h.startswith(("gradient accumulation", "gradient clipping")) for h in loop):
        hints = [h for h in hints if not h.startswith(GENERIC_FACTOR)]
    return hints or [NO_CAUSE]


def failure_message(report: Report) -> str:
    failures = report.failures()
    first = failures[0][0]
    n_bad = len({(e.kind, e.name) for s, e, _ in failures if s == first})
    n_all = len(report.records[first].errors) if first < len(report.records) else 0
    causes = likely_causes(report)
    lines = fit([
        f"{report.describe()} diverges from one device at step {first} (of {len(report.records)}): "
        f"{n_bad} of {n_all} tensors exceed the tolerance",
        f"likely cause: {cited(causes[0])}" if causes[0] is not NO_CAUSE else "likely cause: none known (below)",
    ]) + [
        f"tolerance: {report.tolerance.describe()}",
        *[f"note: {n}" for n in report.notes],
        "",
        divergence_table(report),
        "",
        "max rel err = max |strategy - reference| / max |reference|; norm rel err = ||strategy - "
        "reference|| / ||reference||, judged against the tolerance",
        "",
        "per step: the worst norm rel err of each kind; the floor and line of the worst tensor's kind; "
        "worst / line (> 1 fails):",
        summary_table(report),
        "",
        "likely causes:",
    ]
    lines += [f"  - {h}" for h in causes]
    return "\n".join(lines)
