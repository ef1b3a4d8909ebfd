"""Hints for the user's own training loops (``assert_same_training``), read from what each side's
loop was seen doing (``record.watch``, ``record.step_recorder``), each naming its evidence and the fix:

- the rows the sides trained on: every rank the same rows (no DistributedSampler), or, for a
  tensor-parallel model, ranks with different rows (rank-dependent inputs: the bug there); the
  ranks' rows together not the reference's batch (its size: a batch not divided by the world size;
  its rows: another sampler or shuffle order);
- a shuffle order that repeats on one side only (``set_epoch`` never called);
- an optimizer stepping parameters of no model run forward (built on a copy of the model);
- parameters that never moved although their gradients are nonzero;
- parameters equal at step 0 but losses that differ (different batches, another loss).
"""
from __future__ import annotations

import math
from collections import Counter
from typing import List

from .numbers import Report, UserFacts, common_factor
from ..judge.layout import Layout
from .optimizer import clip_hint, schedule_hint, state_hint
from ..record.recorder import SideLog
from ..judge.vacuous import never_moved, zero_grads

REFERENCE = "reference_fn"


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
    facts.tp_inputs_differ = facts.tensor_parallel and any(
        _tp_rows(facts, i, ref_rows, rows) for i, (ref_rows, rows) in enumerate(zip(facts.ref_rows, facts.rank_rows))
        if ref_rows and all(rows))
    facts.rank_lrs = [s.lrs for s in ranks[0].steps[:steps]]
    facts.rank_states = [s.state for s in ranks[0].steps[:steps]]
    facts.carried = carried_over(ranks[0], ref) if ranks else ""
    facts.rank_backwards = ranks[0].steps[0].backwards if ranks and ranks[0].steps else 1
    facts.ref_states = [s.state for s in ref.steps]
    facts.ref_lrs = [s.lrs for s in ref.steps]
    facts.rank_clips = [[_factors(side.steps[i]) for side in ranks] for i in range(steps)]
    facts.ref_clips = [_factors(s) for s in ref.steps]
    facts.rank_clip_norms = [[c[0] for c in s.steps[i].clips] for s in ranks[:1] for i in range(steps)]
    facts.ref_clip_norms = [[c[0] for c in s.clips] for s in ref.steps]
    facts.clips_dtensors = any(side.dtensors for side in ranks) or any(
        len(c) > 2 and c[2] for side in ranks for s in side.steps for c in s.clips)
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


def _factors(step) -> List[float]:
    """The factor each gradient clipping of a step scaled the gradients by (1: under max_norm)."""
    return [min(1.0, m / (n + 1e-6)) if math.isfinite(n) else math.nan for n, m, *_ in step.clips]


def loop_hints(report: Report) -> List[str]:
    """The hints for a report of ``assert_same_training``; none for other reports."""
    f = report.facts
    if not isinstance(f, UserFacts) or not f.ref_rows:
        return []
    epochs, rows, scaled = _epochs(f), _rows(f), _loss_factor(f)
    factor = _grad_factor(report)
    # what the optimizer held and was told, the earliest evidence first (a later one may be its consequence);
    # a clip factor moves with anything else that changed the gradients, so it comes after the data's evidence
    told = sorted(h for h in (state_hint(f), schedule_hint(f)) if h[1])
    hints = [_nonfinite(f), _carried(f), _accumulation(f, factor), *(text for _, text in told), epochs, rows,
             clip_hint(f, factor)[1], scaled, _elsewhere(f), _frozen(f)]
    if not any(hints) and not f.dropout:
        hints.append(_same_params_other_loss(report))
    return [h for h in hints if h]


def _key(rows: List[float]) -> Counter:
    return Counter(float(f"{v:.12g}") for v in rows)


def _group_rows(f: UserFacts, ranks: List[List[float]]) -> List[List[float]]:
    """One list of rows per data group: a group of tensor-parallel peers trains one batch (each peer
    the same rows, or its own shard of the rows under sequence parallelism)."""
    groups = f.data_groups or [[r] for r in range(len(ranks))]
    out = []
    for g in groups:
        peers = [ranks[r] for r in g if r < len(ranks)]
        same = all(_key(p) == _key(peers[0]) for p in peers[1:])
        out.append(list(peers[0]) if same else [v for p in peers for v in p])
    return out


def _rows(f: UserFacts) -> str:
    """The first step at which the rows tell something is off, and what."""
    for step, (ref, ranks) in enumerate(zip(f.ref_rows, f.rank_rows)):
        if not ref or not all(ranks):
            continue
        said = _tp_rows(f, step, ref, ranks) if f.tensor_parallel else ""
        groups = _group_rows(f, ranks)
        said = said or _dp_rows(step, ref, groups, len(ranks))
        if said:
            return said
    return ""


def _tp_rows(f: UserFacts, step: int, ref: List[float], ranks: List[List[float]]) -> str:
    """Peers of a tensor-parallel group must train one batch: the same rows, or (sequence-sharded
    inputs) shards that together are rows of the reference."""
    for g in f.data_groups:
        peers = [r for r in g if r < len(ranks)]
        differs = [r for r in peers[1:] if _key(ranks[r]) != _key(ranks[peers[0]])]
        if not differs:
            mine = ranks[peers[0]]
            if len(f.data_groups) == 1 and len(peers) > 1 and len(ref) == len(peers) * len(mine) \
                    and not (_key(mine) - _key(ref)):
                return (f"every tensor-parallel peer fed the same rows: at step {step} ranks "
                        f"{', '.join(map(str, peers))} each fed the same {len(mine)} rows, while the reference "
                        f"trained {len(ref)} = {len(peers)} x {len(mine)}: with sequence-sharded inputs "
                        "(input_layouts=Shard(0)) each peer holds its own shard of the batch. Fix: feed each "
                        "rank its shard of the rows, or give the plan Replicate() input layouts and the whole "
                        "batch on every rank.")
            continue
        together = sum((_key(ranks[r]) for r in peers), Counter())
        if not (together - _key(ref)):
            continue  # each peer a shard of the reference's rows: sequence-sharded input, by design
        return (f"rank-dependent inputs to a tensor-parallel model: ranks {', '.join(map(str, peers))} share its "
                f"parameters as DTensors, so they must feed one batch, but at step {step} rank(s) "
                f"{', '.join(map(str, differs))} fed other rows than rank {peers[0]}. A DistributedSampler, a seed "
                "or a data slice that depends on the rank does that. Fix: give every rank of a tensor-parallel "
                "group the same batch (shard the data over the data-parallel dimension only, the same seed).")
    return ""


def _dp_rows(step: int, ref: List[float], groups: List[List[float]], world: int) -> str:
    """The data-parallel groups' rows against the reference's batch."""
    first = _key(groups[0])
    if len(groups) > 1 and all(_key(g) == first for g in groups[1:]):
        if len(ref) <= len(groups[0]):
            return _missing(step, ref, groups)  # one batch for all by design; another batch on one side
        return (f"the data is not sharded: at step {step} every one of the {len(groups)} data-parallel ranks trained "
                f"on the same {len(groups[0])} rows while the reference trained on {len(ref)}, so the ranks repeat "
                "each other's samples. Fix: give the DataLoader sampler=DistributedSampler(dataset) (and call "
                "sampler.set_epoch(epoch) every epoch), so that each rank gets its own shard.")
    sizes = [len(g) for g in groups]
    if sum(sizes) != len(ref):
        who = "ranks" if len(groups) == world else "data-parallel groups"
        return (f"the sides train on batches of another size: at step {step} the {who} trained on "
                f"{' + '.join(map(str, sizes))} = {sum(sizes)} rows, the reference on {len(ref)}. The global "
                f"batch is the data-parallel ranks' batches together: give the one-device loop batch_size x "
                f"{len(groups)} ({sizes[0]} x {len(groups)} = {sizes[0] * len(groups)}), or each rank "
                f"batch_size // {len(groups)}.")
    said = _missing(step, ref, groups)
    if said:
        return said
    if len(set(sizes)) > 1:
        return (f"unequal shards: at step {step} the data-parallel ranks trained on {'/'.join(map(str, sizes))} "
                f"rows ({sum(sizes)} in all, the reference's batch). DDP and FSDP average the ranks' gradients with "
                "equal weight, so with each rank's mean loss a row on a smaller shard counts more than one on a "
                f"larger. Fix: an even split (drop_last=True, or a batch divisible by {len(groups)}), or weight each "
                "rank's loss by its rows: loss * local_rows * world_size / global_rows.")
    return ""


def _missing(step: int, ref: List[float], groups: List[List[float]]) -> str:
    """Rows of the reference's batch that no data-parallel group trained on."""
    together = _key(groups[0]) if _same_rows(groups) else sum((_key(g) for g in groups), Counter())
    missing = sum((_key(ref) - together).values())
    if not missing:
        return ""
    return (f"the sides saw different batches at step {step}: {missing} of the reference's {len(ref)} rows "
            "are on no rank. The ranks' samplers draw another order than the reference's (a "
            "DistributedSampler shuffles with its seed and epoch; a shuffling DataLoader with the global "
            "random state), or the data differs. Fix: draw the reference's batches as the ranks' shards "
            "together, e.g. DistributedSampler(dataset, num_replicas=1, rank=0) with the same shuffle, "
            "seed and set_epoch, and batch_size x world_size.")


def _same_rows(groups: List[List[float]]) -> bool:
    return len(groups) > 1 and all(_key(g) == _key(groups[0]) for g in groups[1:])


def _repeat(rows_per_step: List[List[float]]) -> int:
    """The first step > 0 that trained on exactly step 0's rows again (0: none did)."""
    if not rows_per_step or not rows_per_step[0]:
        return 0
    first = _key(rows_per_step[0])
    return next((s for s, rows in enumerate(rows_per_step) if s and rows and _key(rows) == first), 0)


def _epochs(f: UserFacts) -> str:
    """One side's shuffle order repeats (a later step sees step 0's rows again), the other's not."""
    ref, ranks = _repeat(f.ref_rows), _repeat([per_rank[0] for per_rank in f.rank_rows])
    if bool(ref) == bool(ranks):
        return ""  # neither repeats, or both alike: they agree on the order
    who, step = (REFERENCE, ref) if ref else ("fn on rank 0", ranks)
    if f.set_epoch_calls.get(who) or not f.sampler_passes.get(who):
        return (f"data repeated: at step {step} {who} trained on exactly the rows of step 0 again, while the other "
                "side went on to new rows: its data iterator started over (a loop restarted after loading a "
                "checkpoint, or an epoch counter reset) instead of resuming where it stopped. Fix: restore the "
                "epoch and the position in it with the checkpoint (set_epoch with the saved epoch, and skip the "
                "batches already trained).")
    never = " (it never calls DistributedSampler.set_epoch)"
    return (f"the shuffle order repeats across epochs: at step {step} {who} trained on exactly the rows of step 0 "
            f"again{never}, while the other side reshuffled. A DistributedSampler shuffles with seed + epoch, "
            "so without set_epoch every epoch repeats the first one's order. Fix: call sampler.set_epoch(epoch) "
            "at the start of every epoch, on every side.")


def _grad_factor(report: Report) -> float:
    """The factor every gradient at step 0 shares against the reference's (1.0: none)."""
    first = report.records[0].errors if report.records else []
    return common_factor([e.norm_ratio for e in first if e.kind == "grad" and not e.name.startswith("rank ")
                          and not e.missing and e.norm_ref > 0 and math.isfinite(e.norm_ratio)])


def _accumulation(f: UserFacts, factor: float) -> str:
    """The ranks accumulate k micro-batches per step and every gradient is k x the reference's."""
    k = f.rank_backwards
    if k < 2 or abs(factor / k - 1) > 0.02:
        return ""
    also = f" (here k is also the world size {f.world_size}: a loss multiplied by it looks the same)" \
        if k == f.world_size else ""
    return (f"gradient accumulation without dividing the loss: the ranks backpropagate {k} losses per optimizer step "
            f"and every gradient at step 0 is {factor:.4g}x the reference's = {k}{also}: each micro-batch's loss is "
            f"backpropagated undivided, so the step's gradient is the sum of {k} means. Fix: backpropagate "
            f"loss / {k} (the number of micro-batches accumulated per step).")


def carried_over(rank: SideLog, ref: SideLog) -> str:
    """The first side and step whose gradients are the other side's plus its own previous step's:
    gradients that were never zeroed between steps ("" where none)."""
    import torch

    def flat(grads) -> "torch.Tensor":
        ts = [g.double().reshape(-1) for _, g in sorted(grads.items()) if g is not None]
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
    """``now`` = a * ``before`` + b * ``other`` with a > 0, to 5% of the sides' gap: this step's
    gradients hold the previous step's (clipping may have scaled both terms, hence a and b)."""
    import torch

    basis = torch.stack([before, other], dim=1)
    coef = torch.linalg.lstsq(basis, now.unsqueeze(1)).solution.squeeze(1)
    rest = float((now - basis @ coef).norm())
    return float(coef[0]) > 0.05 and rest < 0.05 * gap


def _carried(f: UserFacts) -> str:
    if not f.carried:
        return ""
    who, step = f.carried.rsplit(" at step ", 1)
    return (f"gradients not zeroed between steps: at step {step} the gradients of {who} are the other side's "
            f"plus its own of step {int(step) - 1}, so each step adds to the last one's gradients instead of replacing "
            "them. Fix: call optimizer.zero_grad() (or model.zero_grad()) once per optimizer step, after "
            "optimizer.step() (with accumulation: after the step, not after each micro-batch).")


def _nonfinite(f: UserFacts) -> str:
    """Parameters not finite before the first update: uninitialized memory, named before the rest."""
    if not f.nonfinite:
        return ""
    who = sorted(f.nonfinite, key=lambda w: w != REFERENCE)[-1]
    names = f.nonfinite[who]
    return (f"non-finite weights at step 0: in {who}, {len(names)} parameter(s) hold inf or NaN before any update "
            f"({', '.join(names[:4])}{', ...' if len(names) > 4 else ''}). That is memory never initialised: a model "
            "built on the meta device and moved with to_empty(), whose reset_parameters()/init_weights() does "
            "not reset every module, or a checkpoint holding NaN. Fix: initialise every parameter after "
            "to_empty() (model.apply(init) over all submodules), then compare.")


def _elsewhere(f: UserFacts) -> str:
    if not f.foreign:
        return ""
    who = sorted(f.foreign)[0]
    names, unstepped = f.foreign[who], f.unstepped.get(who, [])
    loose = f", while the model it runs forward has {len(unstepped)} parameter(s) with gradients that no " \
        f"optimizer steps ({', '.join(unstepped[:3])}{', ...' if len(unstepped) > 3 else ''})" if unstepped else ""
    return (f"the optimizer holds other parameters: in {who} it steps {len(names)} parameter(s) that belong to no "
            f"model run forward{loose}, so the trained model never changes. The optimizer was built on another "
            "copy of the model (copy.deepcopy before wrapping, a model rebuilt or reloaded after the optimizer "
            "was made). Fix: build the optimizer from the parameters of the model you run (model.parameters() "
            "of the very object you call).")


def _frozen(f: UserFacts) -> str:
    sides = [who for who in sorted(f.frozen) if who not in f.foreign]
    if not sides:
        return ""
    who = sides[0]
    return (f"parameters that never change: {who}'s parameters never moved over its {f.frozen[who]} step(s) "
            "although their gradients are nonzero: its optimizer holds other parameters than the model's, or "
            "its learning rate is 0.")


def _loss_factor(f: UserFacts) -> str:
    """The scalar backpropagated on the ranks is the world size (or its inverse) times the
    reference's at step 0: a loss scaled before backward (clipping can hide it in the gradients)."""
    if f.world_size < 2 or not f.rank_losses or not f.ref_losses or f.tensor_parallel:
        return ""  # tensor/sequence-parallel peers hold parts of one loss: no replica mean to scale
    mean, ref = sum(f.rank_losses[0]) / f.world_size, f.ref_losses[0]
    if not (ref and math.isfinite(ref) and math.isfinite(mean)):
        return ""
    k, w = mean / ref, f.world_size
    if abs(k / w - 1) < 0.02:
        what = f"= the world size {w}: the loss is multiplied by the world size before backward"
    elif abs(k * w - 1) < 0.02:
        what = f"= 1/{w}: the loss is divided by the world size before backward"
    else:
        return ""
    return (f"the loss is scaled by the world size: at step 0 the ranks backpropagated {mean:.6g} on average, "
            f"{k:.4g}x the reference's {ref:.6g} {what} (DDP already averages the gradients; gradient clipping "
            "or Adam can hide the factor in the update, not in the loss). Fix: backpropagate the plain mean loss.")


def _same_params_other_loss(report: Report) -> str:
    """Step 0: the parameters agree, the loss does not (rows not recorded, or not the cause)."""
    if not report.records:
        return ""
    first = report.records[0]
    tol = report.tolerance
    params_ok = all(tol.passes(e, 0) for e in first.errors if e.kind == "param")
    loss_bad = any(not tol.passes(e, 0) for e in first.errors if e.kind == "loss")
    if not (params_ok and loss_bad):
        return ""
    return ("parameters equal at step 0 but the losses differ: the sides computed the loss on different "
            "batches (a sampler, the shuffle order, a batch not divided by the world size) or with another "
            "loss function. Fix: the one-device loop must see, per step, the rows of all ranks together.")
