"""Hints that read the numbers of a parity report for the bugs users write in their own parallel
code: each names its evidence (the factor, the ranks, the stage, the rows) and the fix.

- every gradient off by one constant factor: the world size (SUM all_reduce without dividing, a
  loss multiplied by the world size), its inverse (divided twice), or the batch (reduction="sum");
- ranks that logged the very same loss at every step: the data was not sharded;
- replicas whose parameters or gradients differ between ranks: rank-dependent initialization
  without a broadcast, or gradients never all-reduced (no all_reduce, ``no_sync()`` left on);
- a stage whose parameters get no gradient, or a fraction of it: the graph is cut between stages;
- an output whose rows are the reference's in another order: micro-batches concatenated out of order.
(BatchNorm over micro-batches is read from the facts by ``diagnose.likely_causes`` itself.)
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from ..records import RunFacts, TensorError

# The reports these read are parity.report's ParityReport; typed as Any so that this module and
# diagnose, which parity.report imports, import nothing back (data flows one way).
Report = Any

REPLICA = "rank "  # replica rows are named "rank r: <name>" (rank r against rank 0)


@dataclass
class UserFacts(RunFacts):
    """What the user's own code showed, beyond ``RunFacts``: the evidence these hints read."""

    rank_losses: List[List[float]] = field(default_factory=list)  # per step, per rank
    rank_batchnorm: List[str] = field(default_factory=list)  # BatchNorm in training mode on the ranks
    stage_of: Dict[str, str] = field(default_factory=dict)  # reference parameter name -> user stage
    output_order: Optional[List[int]] = None  # user output row i is reference row output_order[i]
    # The user's training loops (assert_same_training), read by hints.loops:
    rank_rows: List[List[List[float]]] = field(default_factory=list)  # per step, per rank: input rows
    ref_rows: List[List[float]] = field(default_factory=list)  # per step: the reference's input rows
    ref_losses: List[float] = field(default_factory=list)  # per step: the reference's loss
    tensor_parallel: bool = False  # DTensor parameters that are not FSDP's: ranks must see the same rows
    foreign: Dict[str, List[str]] = field(default_factory=dict)  # side -> stepped params of no model run
    unstepped: Dict[str, List[str]] = field(default_factory=dict)  # side -> model params no optimizer steps
    set_epoch_calls: Dict[str, int] = field(default_factory=dict)  # side -> DistributedSampler.set_epoch calls
    sampler_passes: Dict[str, int] = field(default_factory=dict)  # side -> passes over a DistributedSampler
    carried: str = ""  # "<side> at step <s>": gradients that kept the previous step's (no zero_grad)
    frozen: Dict[str, int] = field(default_factory=dict)  # side -> steps its parameters never moved in
    loop_notes: List[str] = field(default_factory=list)  # how the steps were recorded and the ranks judged
    data_groups: List[List[int]] = field(default_factory=list)  # ranks sharing one batch (TP/SP peers)
    rank_lrs: List[List[float]] = field(default_factory=list)  # per step: rank 0's learning rates
    ref_lrs: List[List[float]] = field(default_factory=list)  # per step: the reference's
    rank_clips: List[List[List[float]]] = field(default_factory=list)  # per step, per rank: clip factors
    ref_clips: List[List[float]] = field(default_factory=list)  # per step: the reference's clip factors
    rank_clip_norms: List[List[float]] = field(default_factory=list)  # per step: rank 0's total norms clipped
    ref_clip_norms: List[List[float]] = field(default_factory=list)  # per step: the reference's
    clips_dtensors: bool = False  # the ranks' parameters (or the norms they clipped) are DTensors
    nonfinite: Dict[str, List[str]] = field(default_factory=dict)  # side -> parameters not finite at step 0
    rank_states: List[tuple] = field(default_factory=list)  # per step: rank 0's optimizer (held, step count)
    ref_states: List[tuple] = field(default_factory=list)  # per step: the reference's
    rank_backwards: int = 1  # scalars rank 0 backpropagated at step 0 (> 1: gradient accumulation)
    tp_inputs_differ: bool = False  # tensor-parallel peers fed rows that are not one batch (rank-dependent)


def replica_name(rank: int, name: str) -> str:
    return f"{REPLICA}{rank}: {name}"


def _replica(e: TensorError) -> Optional[int]:
    if not e.name.startswith(REPLICA) or ": " not in e.name:
        return None
    head = e.name[len(REPLICA):].split(": ", 1)[0]
    return int(head) if head.isdigit() else None


def number_hints(report: Report) -> List[str]:
    """The hints for a report of the user's own code (``UserFacts``); none for other reports."""
    f = report.facts
    if not isinstance(f, UserFacts):
        return []
    hints = [_factor(report, f), _same_losses(f), _replicas(report, f), _output_order(f)]
    hints += _stages(report, f)
    if f.rank_batchnorm and f.world_size > 1:
        hints.append(
            f"BatchNorm on the ranks: {len(f.rank_batchnorm)} BatchNorm module(s) in training mode "
            f"({', '.join(f.rank_batchnorm[:4])}) normalize each rank's shard with its own statistics. "
            "Fix: torch.nn.SyncBatchNorm.convert_sync_batchnorm(model) before wrapping it in DDP.")
    return [h for h in hints if h]


def common_factor(ratios: List[float]) -> float:
    """The factor every ||strategy grad|| / ||reference grad|| shares (within 2% of their median);
    1.0 when fewer than two, when they disagree, or when it is within 5% of 1 (roundoff)."""
    if len(ratios) < 2:
        return 1.0
    k = statistics.median(ratios)
    if abs(k - 1) < 0.05 or any(abs(r - k) > 0.02 * abs(k) for r in ratios):
        return 1.0
    return k


def _first_grads(report: Report) -> List[TensorError]:
    first = report.records[0].errors if report.records else []
    return [e for e in first if e.kind == "grad" and _replica(e) is None and not e.missing
            and e.norm_ref > 0 and math.isfinite(e.norm_ratio)]


def _factor(report: Report, f: UserFacts) -> str:
    """Step 0's gradients (same weights on both sides) all off by one factor."""
    ratios = [e.norm_ratio for e in _first_grads(report)]
    k = common_factor(ratios)
    if k == 1.0 or (abs(k * f.world_size - 1) > 0.02 and abs(k / f.world_size - 1) > 0.02 and _replica_grads_differ(report)):
        return ""  # replicas that disagree at step 0: rank 0 alone is one shard, its ratio means nothing
    w = f.world_size
    seen = f"every gradient at step 0 is {k:.4g}x the reference's ({len(ratios)} tensors agree)"
    if w > 1 and abs(k / w - 1) < 0.02:
        return (f"gradients scaled by the world size: {seen} = the world size {w}. The gradients are "
                "summed over ranks and not divided (all_reduce with ReduceOp.SUM and no / world_size), "
                "or the loss is multiplied by the world size before backward (DDP already averages). "
                "Fix: divide the all-reduced gradients by the world size (or ReduceOp.AVG), and "
                "backpropagate the plain mean loss.")
    if w > 1 and abs(k * w - 1) < 0.02:
        return (f"gradients divided by the world size once too often: {seen} = 1/{w}. The loss is "
                "divided by the world size and the gradients averaged again (DDP averages already), "
                "or an averaged all_reduce is divided once more. Fix: divide once.")
    return (f"gradients scaled by a constant: {seen}. A loss with reduction='sum' (the factor is then "
            "the number of samples per rank) or a loss multiplied by a constant. Fix: use "
            "reduction='mean' as the reference does, or scale both sides alike.")


def _same_losses(f: UserFacts) -> str:
    # tensor parallel: every rank computes the same loss by design; with input rows recorded,
    # hints.loops says it from the rows themselves
    if f.world_size < 2 or not f.rank_losses or f.tensor_parallel or any(f.rank_rows):
        return ""
    if not all(len(set(losses)) == 1 for losses in f.rank_losses):
        return ""
    first = f.rank_losses[0]
    return (f"the data is not sharded: ranks 0-{len(first) - 1} logged the same loss at every step "
            f"(step 0: {first[0]:.6g} on every rank), so every rank trains on the same samples. Fix: "
            "give the DataLoader a DistributedSampler(dataset) (and call sampler.set_epoch(epoch) "
            "every epoch), so that each rank gets its own shard.")


def _replica_grads_differ(report: Report) -> bool:
    if not report.records:
        return False
    return any(_replica(e) is not None and e.kind == "grad" and not report.tolerance.passes(e, 0)
               for e in report.records[0].errors)


def _replicas(report: Report, f: UserFacts) -> str:
    bad = [(s, e) for s, e, _ in report.failures() if _replica(e) is not None]
    if not bad or f.tp_inputs_differ:
        return ""  # tensor parallel with rank-dependent inputs: hints.loops names the inputs
    step, first = bad[0]
    ranks = sorted({r for _, e in bad if (r := _replica(e)) is not None})
    kinds = {e.kind for s, e in bad if s == step}
    count = sum(1 for s, _ in bad if s == step)
    where = (f"rank(s) {', '.join(map(str, ranks))} differ from rank 0 (replicas that should be "
             f"equal): {count} tensor(s) at step {step}, e.g. {first.name} (norm rel err {first.rel:.3g})")
    if step == 0 and "param" in kinds:
        return (f"the ranks start from different weights: {where}, before any update. The model is "
                "initialized differently per rank (a seed that depends on the rank, or random init "
                "after seeding per rank) and never broadcast. Fix: seed every rank alike before "
                "building the model, or broadcast rank 0's parameters (DDP's constructor does).")
    if "param" in kinds and not f.tensor_parallel:
        return (f"one rank's update differs: the weights before step {step} differ between ranks ({where}), "
                f"though up to step {step - 1} the ranks agreed: the update of step {step - 1} was not the "
                "same on every rank (a learning rate, scheduler or optimizer state that depends on the rank, "
                "a step or clipping taken on some ranks only, or a model changed outside the optimizer on one "
                "rank). Fix: build the optimizer and scheduler alike on every rank and step them on every rank.")
    if f.tensor_parallel:
        return (f"gradients not reduced across the tensor-parallel group: {where}. A parameter kept whole on "
                "every rank of a tensor/sequence-parallel mesh (a norm's weight under sequence parallelism, a "
                "bias) gets only its own shard's part of the gradient on each rank, and the parts must be summed "
                "over the group. Fix: put the module in parallelize_module's plan (SequenceParallel() for a norm "
                "between sequence-sharded activations), so its weight becomes a Replicate DTensor whose gradient "
                "is reduced, or all_reduce that gradient over the tp mesh's group before optimizer.step().")
    return (f"gradients are not synchronized between ranks: {where}. Each rank steps with its own "
            "shard's gradients: no all_reduce of the gradients, a no_sync() context left on, or a "
            "backward outside the DDP wrapper. Fix: all_reduce every gradient and divide by the world "
            "size (or train through DDP), and use no_sync() only on accumulation steps.")


def _stages(report: Report, f: UserFacts) -> List[str]:
    """Per stage of the user's module: its share of parameters with no gradient, and its ratio."""
    if not f.stage_of or not report.records:
        return []
    by_stage: Dict[str, List[TensorError]] = {}
    for e in report.records[0].errors:
        if e.kind == "grad" and e.name in f.stage_of:
            by_stage.setdefault(f.stage_of[e.name], []).append(e)
    healthy = [s for s, es in by_stage.items() if _stage_ratio(es) > 0.95]
    out = []
    for stage, errs in by_stage.items():
        missing = [e for e in errs if e.missing == "strategy"]
        ratio = _stage_ratio(errs)
        if len(missing) == len(errs):
            out.append(f"stage {stage!r} gets no gradient: none of its {len(errs)} parameters has a .grad "
                       "after backward (the reference's do). The graph is cut between stages: a "
                       ".detach(), .data, torch.no_grad() or a tensor rebuilt from values on the way "
                       "to the next stage. Fix: pass the activation on with .to(device), which "
                       "autograd follows.")
        elif healthy and stage not in healthy and 0 < ratio < 0.9:
            out.append(f"stage {stage!r} gets part of its gradient: its gradients are {ratio:.3g}x the "
                       f"reference's at step 0 while stage(s) {', '.join(healthy)} match. Some "
                       "micro-batches do not backpropagate into it (a detach on some of them). Fix: "
                       "keep every micro-batch's activation in the graph.")
    return out


def _stage_ratio(errors: List[TensorError]) -> float:
    ratios = [0.0 if e.missing == "strategy" else e.norm_ratio for e in errors
              if e.norm_ref > 0 and math.isfinite(e.norm_ratio)]
    return statistics.median(ratios) if ratios else 1.0


def _output_order(f: UserFacts) -> str:
    order = f.output_order
    if not order or order == sorted(order):
        return ""
    moved = [f"row {i} is reference row {j}" for i, j in enumerate(order) if i != j][:3]
    return (f"the output rows are the reference's in another order ({'; '.join(moved)}, ...): the "
            "micro-batch outputs are concatenated out of order, so outputs no longer line up with "
            "their targets. Fix: append each micro-batch's output in input order and torch.cat once.")
