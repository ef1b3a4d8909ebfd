"""Causes read from what the run is (facts), not from where it differs: a BatchNorm in training
mode over shards, active dropout, a loss summed under averaging, uneven shards or micro-batches,
unused parameters, a low precision, a bitwise demand. For the built-in strategies they are the causes;
for the user's own loops they are said after the evidence, as possible."""
from __future__ import annotations

import math
from typing import Callable, Final, List, Tuple

from ..judge.tolerance import DATA_PARALLEL
from ..records import RunFacts, TensorError
from .finding import Report, common_factor, listed as _names


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
def _rank_batchnorm(report: Report) -> str:
    f = report.facts
    names = getattr(f, "rank_batchnorm", [])
    mine, ref = getattr(f, "batchnorm_rows", (0, 0))
    if not (names and f.world_size > 1) or (mine and ref and ref <= mine):
        return ""  # none, or the reference normalises over blocks of a rank's size too
    return (f"BatchNorm on the ranks: {len(names)} BatchNorm module(s) in training mode ({_names(names)}) normalize "
            "each rank's shard with its own statistics. Fix: torch.nn.SyncBatchNorm.convert_sync_batchnorm(model) "
            "before wrapping it in DDP.")


FACT_HINTS: Final[Tuple[Callable[[Report], str], ...]] = (
    _batchnorm, _rank_batchnorm, _dropout, _scaling, _uneven_shards, _uneven_microbatches, _unused, _low_precision, _bitwise)


def possible_causes(report: Report) -> List[str]:
    """The facts' hints that apply, in the order above."""
    return [h for h in (hint(report) for hint in FACT_HINTS) if h]
