"""The evidence of the user's own loops gathered from the sides' records (test process), into
``UserFacts``: what the phase modules read besides the per-tensor errors."""
from __future__ import annotations

import math
from typing import Any, Dict, List

from ..layout.groups import Layout
from ..judge.vacuous import never_moved, zero_grads
from ..record.recorder import SideLog
from .ema import side_momenta
from .facts import REFERENCE, UserFacts
from .gradients import carried_over
from .inputs import sequence_split, tp_rows_differ
from .outputs import agree


def _state_facts(facts: UserFacts, ranks: List[SideLog], ref: SideLog, steps: int) -> None:
    """The state each step started from: learning rates, hyperparameters, optimizer state, state no
    optimizer steps (and that state before the first forward)."""
    facts.rank_lrs = [[side.steps[i].lrs for side in ranks] for i in range(steps)]
    facts.ref_lrs = [s.lrs for s in ref.steps]
    facts.rank_hyper = [[side.steps[i].hyper for side in ranks] for i in range(steps)]
    facts.ref_hyper = [s.hyper for s in ref.steps]
    facts.rank_states = [[side.steps[i].state for side in ranks] for i in range(steps)]
    facts.ref_states = [s.state for s in ref.steps]
    facts.untrained = [[side.steps[i].untrained for side in ranks] for i in range(steps)]
    facts.ref_untrained = [s.untrained for s in ref.steps]
    facts.rank_start, facts.ref_start = [side.start for side in ranks], ref.start
    side_momenta(facts, ranks, ref)


def side_facts(facts: UserFacts, ranks: List[SideLog], ref: SideLog, layout: Layout) -> None:
    """Fill the loop evidence of ``facts`` from the sides' records (test process)."""
    steps = len(ref.steps)
    facts.ref_rows = [s.rows for s in ref.steps]
    facts.ref_losses = [s.loss for s in ref.steps]
    # a pipeline's later stages take activations, not the batch: the rows are the first stage's
    first = layout.stages[0] if layout.pipeline else list(range(len(ranks)))
    facts.rank_rows = [[ranks[r].steps[i].rows for r in first] for i in range(steps)]
    facts.data_groups = [[first.index(r) for r in g if r in first] for g in layout.groups if set(g) & set(first)]
    facts.tensor_parallel = layout.tensor_parallel or any(side.tensor_parallel for side in ranks)
    facts.dropout = [f"{n} in {REFERENCE}" for n in ref.dropout] + \
        [f"{n} in fn on the ranks" for n in dict.fromkeys(n for side in ranks for n in side.dropout)]
    facts.rank_batchnorm = [] if facts.tensor_parallel else list(ranks[0].batchnorm)
    facts.tp_inputs_differ = facts.tensor_parallel and tp_rows_differ(facts)
    _state_facts(facts, ranks, ref, steps)
    facts.carried = carried_over(ranks[0], ref) if ranks else ""
    facts.rank_backwards = max((side.steps[0].backwards for side in ranks if side.steps), default=1)
    facts.rank_step_backwards = [[side.steps[i].backwards for side in ranks] for i in range(steps)]
    facts.ref_step_backwards = [s.backwards for s in ref.steps]
    facts.rank_clips = [[_factors(side.steps[i]) for side in ranks] for i in range(steps)]
    facts.ref_clips = [_factors(s) for s in ref.steps]
    facts.rank_scaled = _hand_scales(ranks[0], ref, steps) if ranks else []
    facts.rank_clip_norms = [[c[0] for c in s.steps[i].clips] for s in ranks[:1] for i in range(steps)]
    facts.ref_clip_norms = [[c[0] for c in s.clips] for s in ref.steps]
    facts.rank_first_norms = [[side.steps[i].clips[0][0] if side.steps[i].clips else math.nan for side in ranks]
                              for i in range(steps)]
    facts.clips_dtensors = any(side.dtensors for side in ranks) or any(
        len(c) > 2 and c[2] for side in ranks for s in side.steps for c in s.clips)
    facts.rank_raw = [[side.steps[i].raw_norm for side in ranks] for i in range(steps)]
    facts.ref_raw = [s.raw_norm for s in ref.steps]
    facts.rank_zeroed = [ranks[0].steps[i].zeroed if ranks else [] for i in range(steps)]
    facts.ref_zeroed = [s.zeroed for s in ref.steps]
    facts.rank_modes = [[side.steps[i].modes for side in ranks] for i in range(steps)]
    facts.ref_modes = [s.modes for s in ref.steps]
    facts.rank_where = [[side.steps[i].where for side in ranks] for i in range(steps)]
    facts.ref_where = [s.where for s in ref.steps]
    facts.rank_scaler = [[side.steps[i].scaler for side in ranks] for i in range(steps)]
    facts.ref_scaler = [s.scaler for s in ref.steps]
    facts.rank_metrics = [[side.steps[i].metrics for side in ranks] for i in range(steps)]
    facts.ref_metrics = [s.metrics for s in ref.steps]
    _probed(facts, ranks, ref, layout, first)
    _holdings(facts, ranks, ref, layout)
    facts.recomputed = any(side.recomputed for side in ranks)
    facts.rank_scaler_skips = ranks[0].scaler_skips if ranks else 0
    facts.batchnorm_rows = (max((side.batchnorm_rows for side in ranks), default=0), ref.batchnorm_rows)
    facts.recurrent = next((side.recurrent for side in ranks if side.recurrent), "")
    facts.shards_apart = shards_apart(ranks[0].steps[0].params, ref.steps[0].params, len(ranks)) \
        if ranks and ranks[0].steps and ref.steps else []
    lossy = next((s for s in ranks if s.reduce_dtype), None)
    if lossy is not None:
        facts.reduce_dtype, facts.reduced_by = lossy.reduce_dtype, lossy.reduced_by
    for who, side in [(REFERENCE, ref)] + [(f"fn on rank {r}", s) for r, s in enumerate(ranks)]:
        if side.foreign:
            facts.foreign[who], facts.unstepped[who] = list(side.foreign), list(side.unstepped)
        facts.set_epoch_calls[who] = side.set_epoch_calls
        facts.sampler_passes[who] = side.sampler_passes
        if never_moved(side) and not zero_grads(side):
            facts.frozen[who] = len(side.steps)
        bad = [n for n, t in (side.steps[0].params.items() if side.steps else ())
               if t is not None and t.is_floating_point() and not bool(t.isfinite().all())]
        if bad and not (who != REFERENCE and any(w != REFERENCE for w in facts.nonfinite)):
            facts.nonfinite[who] = bad  # the reference, and the first rank that has some


def _holdings(facts: UserFacts, ranks: List[SideLog], ref: SideLog, layout: Layout) -> None:
    """What each rank holds and feeds: parts of the model (stages, experts or tables held alone beside
    shared tensors), parts of every row (a sequence split)."""
    facts.sequence_split = sequence_split([s.chunks for s in ref.steps], facts.rank_rows)
    if facts.sequence_split and any(side.recurrent == "time-major" for side in ranks):
        facts.loop_notes.append(f"each rank fed its columns of every time step of the reference's batch (rank r: "
                                f"part r of {facts.sequence_split}: a time-major batch split over the ranks), judged "
                                f"as that batch")
    elif facts.sequence_split:
        facts.loop_notes.append(f"each rank fed its part of every row of the reference's batch (rank r: part r of "
                                f"{facts.sequence_split}, along the sequence: context parallel), judged as that batch")
    facts.ref_parts = ref.steps[0].chunks.get(facts.sequence_split, []) if facts.sequence_split and ref.steps else []
    facts.outputs_agree = agree(facts)
    facts.partial_ranks = len(layout.stages) > 1
    facts.shared = sorted(layout.shared) if layout.expert_parallel else []
    facts.owned = sorted(set(ranks[0].steps[0].params) - layout.shared) \
        if layout.expert_parallel and ranks and ranks[0].steps else []


def _factors(step) -> List[float]:
    """The factor each gradient clipping of a step scaled the gradients by (1: under max_norm)."""
    return [min(1.0, m / (n + 1e-6)) if math.isfinite(n) else math.nan for n, m, *_ in step.clips]


def _hand_scales(rank0: SideLog, ref: SideLog, steps: int) -> List[float]:
    """``_scaled`` per step, read only where the reference clipped and rank 0 made no clipping call (a
    clip by hand): a check that clips alike, or not at all, pays nothing for it (NaN there)."""
    return [_scaled(rank0.steps[i]) if ref.steps[i].clips and not rank0.steps[i].clips else math.nan
            for i in range(steps)]


def _scaled(step) -> float:
    """The total norm of the gradients the optimizer was given over the one the step's last backward
    left (NaN where either is unknown): below 1, the loop scaled them in between (a clip by hand)."""
    import torch

    grads = [g for g in step.grads.values() if g is not None and g.is_floating_point()]
    if not grads or not math.isfinite(step.raw_norm) or step.raw_norm <= 0:
        return math.nan
    return float(torch.linalg.vector_norm(torch.stack([g.double().norm() for g in grads]))) / step.raw_norm


def shards_apart(mine: Dict[str, Any], ref: Dict[str, Any], world: int) -> List[int]:
    """The ranks whose dim-0 block of every differing weight is what differs from the reference's, where
    rank 0's blocks all agree: each rank initialised its own shard (FSDP, DTensor) apart. [] otherwise."""
    import torch

    apart: set = set()
    for name, t in mine.items():
        want = ref.get(name)
        if t is None or want is None or t.shape != want.shape or t.dim() == 0 or t.shape[0] < world or torch.equal(t, want):
            continue
        blocks = [not torch.allclose(a.double(), b.double(), rtol=1e-5, atol=1e-7)
                  for a, b in zip(t.chunk(world), want.chunk(world))]
        if blocks[0] or not any(blocks):
            return []
        apart.update(r for r, differs in enumerate(blocks) if differs)
    return sorted(apart)


def _probed(facts: UserFacts, ranks: List[SideLog], ref: SideLog, layout: Layout, first: List[int]) -> None:
    """Step 0's probed outputs on each side, and the calls that made each later step's loss."""
    facts.ref_probes = list(ref.steps[0].probes) if ref.steps else []
    facts.later_ops = [(_ops(ranks[0].steps[s].probes) if ranks and s < len(ranks[0].steps) else [], _ops(step.probes))
                       for s, step in enumerate(ref.steps)]
    # a pipeline's first stage returns activations, not the model's outputs: nothing the reference's match
    facts.rank_probes = [] if layout.pipeline else [list(ranks[r].steps[0].probes) if ranks[r].steps else []
                                                    for r in first]


def _ops(probes) -> list:
    """The calls that made a later step's loss, in order (none for the probed step: its probes' own)."""
    return [op for p in probes if not p.rows and not p.out for op in p.ops]
