"""What the sides' records hold beyond the per-tensor errors, gathered once in the test process:
the evidence the phase modules read (rows, losses, learning rates, optimizer state, clipping, what
each loop was seen doing)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

from ..records import RunFacts

REFERENCE = "reference_fn"


@dataclass
class UserFacts(RunFacts):
    """What the user's own code showed, beyond ``RunFacts``."""

    rank_losses: List[List[float]] = field(default_factory=list)  # per step, per rank
    rank_batchnorm: List[str] = field(default_factory=list)  # BatchNorm in training mode on the ranks
    stage_of: Dict[str, str] = field(default_factory=dict)  # reference parameter name -> user stage
    output_order: Optional[List[int]] = None  # user output row i is reference row output_order[i]
    # The user's training loops (assert_same_training):
    rank_rows: List[List[List[float]]] = field(default_factory=list)  # per step, per rank: input rows
    ref_rows: List[List[float]] = field(default_factory=list)  # per step: the reference's input rows
    ref_losses: List[float] = field(default_factory=list)  # per step: the reference's loss
    tensor_parallel: bool = False  # DTensor parameters that are not FSDP's: ranks must see the same rows
    foreign: Dict[str, List[str]] = field(default_factory=dict)  # side -> stepped params of no model run
    unstepped: Dict[str, List[str]] = field(default_factory=dict)  # side -> model params no optimizer steps
    set_epoch_calls: Dict[str, int] = field(default_factory=dict)  # side -> DistributedSampler.set_epoch calls
    sampler_passes: Dict[str, int] = field(default_factory=dict)  # side -> passes over a DistributedSampler
    frozen: Dict[str, int] = field(default_factory=dict)  # side -> steps its parameters never moved in
    loop_notes: List[str] = field(default_factory=list)  # how the steps were recorded and the ranks judged
    data_groups: List[List[int]] = field(default_factory=list)  # ranks sharing one batch (TP/SP peers)
    rank_lrs: List[List[List[float]]] = field(default_factory=list)  # per step, per rank: learning rates
    ref_lrs: List[List[float]] = field(default_factory=list)  # per step: the reference's
    rank_hyper: List[List[List[Dict[str, float]]]] = field(default_factory=list)  # per step, per rank, per group
    ref_hyper: List[List[Dict[str, float]]] = field(default_factory=list)  # per step, per group
    rank_clips: List[List[List[float]]] = field(default_factory=list)  # per step, per rank: clip factors
    rank_scaled: List[float] = field(default_factory=list)  # per step: rank 0's given / backward's total norm
    ref_clips: List[List[float]] = field(default_factory=list)  # per step: the reference's clip factors
    rank_clip_norms: List[List[float]] = field(default_factory=list)  # per step: rank 0's total norms clipped
    ref_clip_norms: List[List[float]] = field(default_factory=list)  # per step: the reference's
    rank_raw: List[List[float]] = field(default_factory=list)  # per step, per rank: the norm backward left
    ref_raw: List[float] = field(default_factory=list)  # per step: the reference's
    rank_zeroed: List[List[int]] = field(default_factory=list)  # per step: backward passes rank 0 zeroed before
    ref_zeroed: List[List[int]] = field(default_factory=list)  # per step: the reference's
    rank_modes: List[List[tuple]] = field(default_factory=list)  # per step, per rank: (eval, all) BatchNorm/dropout
    ref_modes: List[tuple] = field(default_factory=list)  # per step: the reference's
    recomputed: bool = False  # the ranks recompute forwards inside backward (activation checkpointing)
    update_ratios: Tuple[int, Dict[str, Any]] = (-1, {})  # (step, name -> update_shape.Ratio): rank 0's update there
    batchnorm_rows: Tuple[int, int] = (0, 0)  # the most rows one BatchNorm call took: on a rank, in the reference
    recurrent: str = ""  # the ranks' model holds an RNN: "time-major" or "batch-first" ("" none)
    shared: List[str] = field(default_factory=list)  # expert parallel: the tensors every rank holds (the rest: experts)
    sequence_split: int = 0  # W where each rank fed part r of W of every reference row (context parallel), else 0
    owned: List[str] = field(default_factory=list)  # beside ``shared``: the tensors rank 0 holds alone (experts, tables)
    partial_ranks: bool = False  # each rank holds part of the model (pipeline stages, experts): its optimizer too
    shards_apart: List[int] = field(default_factory=list)  # ranks whose dim-0 shard of the step-0 weights alone differs
    params_before_update: bool = True  # a step's parameters were recorded before its update (not assert_parity's)
    hand_sharded: Dict[str, str] = field(default_factory=dict)  # tensors sharded by hand, put together -> how
    experts_by_rows: bool = False  # ...stacked (3-D) pieces on ranks that each fed their own rows: experts
    pieces_off: Dict[str, List[int]] = field(default_factory=dict)  # such a tensor -> ranks whose starting piece is not their slice
    rank_first_norms: List[List[float]] = field(default_factory=list)  # per step, per rank: first norm clipped (NaN: none)
    clips_dtensors: bool = False  # the ranks' parameters (or the norms they clipped) are DTensors
    nonfinite: Dict[str, List[str]] = field(default_factory=dict)  # side -> parameters not finite at step 0
    rank_states: List[List[tuple]] = field(default_factory=list)  # per step, per rank: (held, step count)
    ref_states: List[tuple] = field(default_factory=list)  # per step: the reference's
    rank_backwards: int = 1  # scalars rank 0 backpropagated at step 0 (> 1: gradient accumulation)
    rank_step_backwards: List[List[int]] = field(default_factory=list)  # per step, per rank: scalars backpropagated
    ref_step_backwards: List[int] = field(default_factory=list)  # per step: the reference's
    tp_inputs_differ: bool = False  # tensor-parallel peers fed rows that are not one batch (rank-dependent)
    carried: str = ""  # "<side> at step <s>": gradients that kept the previous step's (no zero_grad)
    reduce_dtype: str = ""  # the precision the ranks reduce gradients in, where below the parameters'
    reduced_by: str = ""  # what reduces them so
    untrained: List[List[Dict[str, float]]] = field(default_factory=list)  # per step, per rank: state no optimizer steps
    ref_untrained: List[Dict[str, float]] = field(default_factory=list)  # per step: the reference's
    rank_ema: List[List[Optional[float]]] = field(default_factory=list)  # per rank, per step: an EMA's momentum (ema.py)
    ref_ema: List[Optional[float]] = field(default_factory=list)  # per step: the reference's
    copies: List[str] = field(default_factory=list)  # state no optimizer steps named as a trained parameter (a copy)
    rank_start: List[Dict[str, float]] = field(default_factory=list)  # per rank: that state before the first forward
    ref_start: Dict[str, float] = field(default_factory=dict)  # the reference's (its parameters too)
    rank_where: List[List[Dict[str, Tuple[str, ...]]]] = field(default_factory=list)  # per step, per rank: kind -> "file:line"
    ref_where: List[Dict[str, Tuple[str, ...]]] = field(default_factory=list)  # per step: the reference's
    rank_scaler: List[List[tuple]] = field(default_factory=list)  # per step, per rank: (GradScaler scale, call order)
    ref_scaler: List[tuple] = field(default_factory=list)  # per step: the reference's
    rank_scaler_skips: int = 0  # updates rank 0's GradScaler skipped
    rank_metrics: List[List[List[float]]] = field(default_factory=list)  # per step, per rank: scheduler.step(metric)s
    ref_metrics: List[List[float]] = field(default_factory=list)  # per step: the reference's (each after a step)
    rank_probes: List[list] = field(default_factory=list)  # per rank: step 0's outputs and their gradients
    ref_probes: list = field(default_factory=list)  # the reference's (record/probe.py)
    later_ops: List[Tuple[list, list]] = field(default_factory=list)  # per step: the calls that made its loss (rank 0, the reference)
    ref_parts: List[float] = field(default_factory=list)  # step 0: each reference row's sequence_split parts' prints
    outputs_agree: bool = False  # step 0's outputs and the loss's gradient into them are the reference's (outputs.py)
