"""Hints from what the optimizer held and was told at each step (test process): its state (not
restored from a checkpoint), the learning rate each side stepped with (a scheduler stepped per
micro-batch, not restored, restarted) and the factor each side's gradient clipping scaled by (a norm
computed over one rank's shards only)."""
from __future__ import annotations

import math
from typing import List, Optional, Tuple

Hint = Tuple[int, str]  # (the step of its evidence, the words): the earliest is said first
NONE: Hint = (0, "")

from .numbers import UserFacts

SAME_LR = 1e-9  # relative: one schedule computes the same float on both sides
SAME_CLIP = 1e-2  # relative: a clip factor from the same norm, up to the sides' roundoff


def _differs(a: float, b: float, rel: float) -> bool:
    return abs(a - b) > rel * max(abs(a), abs(b), 1e-30)


def _lr_at(lrs: List[List[float]], step: int) -> Optional[float]:
    return lrs[step][0] if step < len(lrs) and lrs[step] else None


def schedule_hint(f: UserFacts) -> Hint:
    """The first step at which the sides stepped with other learning rates, and what that looks like."""
    steps = min(len(f.rank_lrs), len(f.ref_lrs))
    first = next((s for s in range(steps) if f.rank_lrs[s] and f.ref_lrs[s] and
                  any(_differs(a, b, SAME_LR) for a, b in zip(f.rank_lrs[s], f.ref_lrs[s]))), None)
    if first is None:
        return NONE
    return first, _schedule_words(f, first, steps)


def _schedule_words(f: UserFacts, first: int, steps: int) -> str:
    mine, theirs = f.rank_lrs[first][0], f.ref_lrs[first][0]
    shown = ", ".join(f"{_lr_at(f.rank_lrs, s):.4g}/{_lr_at(f.ref_lrs, s):.4g}" for s in range(min(steps, 6)))
    head = (f"the learning rate differs: at step {first} fn on the ranks stepped with lr {mine:.6g}, reference_fn "
            f"with {theirs:.6g} (ranks/reference per step: {shown}{', ...' if steps > 6 else ''}). ")
    ratios = {round(f.rank_lrs[s][0] / f.ref_lrs[s][0], 6) for s in range(steps)
              if f.rank_lrs[s] and f.ref_lrs[s] and f.ref_lrs[s][0]}
    if len(ratios) == 1:
        k = ratios.pop()
        also = f" = the world size {f.world_size}" if abs(k - f.world_size) < 1e-6 else \
            f" = 1/{f.world_size}" if abs(k * f.world_size - 1) < 1e-6 else ""
        return head + (f"The ranks' lr is {k:.4g}x the reference's at every step{also}: another base learning rate "
                       "(scaled by the world size or the global batch on one side). Fix: give both sides the same "
                       "learning rate; DDP and FSDP average the gradients, so the one-device loop on the global "
                       "batch takes the same lr.")
    faster = _faster(f, steps)
    if faster:
        return head + (f"The ranks' schedule runs {faster}x as fast as the reference's (its lr at step s is the "
                       f"reference's at step {faster}s, give or take a step): the scheduler is stepped per micro-batch (or per "
                       f"{faster} calls) instead of once per optimizer step. Fix: call scheduler.step() right "
                       "after optimizer.step(), once per step.")
    return head + ("A scheduler stepped at another rate, created with other arguments, restarted, or not restored "
                   "with a checkpoint (its state_dict saved and loaded beside the optimizer's), or another base lr "
                   "or warm-up on one side. Fix: step and restore the scheduler alike on both sides.")


def _faster(f: UserFacts, steps: int) -> int:
    """k > 1 where the ranks' lr at every step s is the reference's at step k*s + b for one b in
    0..k (a scheduler stepped k times per optimizer step, before or after it); 0 where none is."""
    ref = [lrs[0] for lrs in f.ref_lrs if lrs]
    if len(set(ref)) < 2:
        return 0  # a constant schedule matches any rate
    for k in (2, 3, 4, 8):
        for b in range(k + 1):
            pairs = [(f.rank_lrs[s][0], ref[k * s + b]) for s in range(steps)
                     if k * s + b < len(ref) and f.rank_lrs[s]]
            if len(pairs) >= 2 and all(not _differs(a, r, SAME_LR) for a, r in pairs):
                return k
    return 0


def clip_hint(f: UserFacts, factor: float = 1.0) -> Hint:
    """The first step at which the sides' gradient clipping scaled by other factors. Where one side
    clipped by hand (no clipping call seen), its factor at step 0 is read from the gradients: they
    are ``factor`` x the reference's."""
    for step, (ranks, ref) in enumerate(zip(f.rank_clips, f.ref_clips)):
        mine = ranks[0] if ranks else []
        if not mine and ref and step == 0 and factor != 1.0 and math.isfinite(ref[0]):
            mine, ranks = [factor * ref[0]], [[factor * ref[0]]]  # the ranks scaled their gradients by hand
        if bool(mine) != bool(ref):
            said = _one_side(step, mine or ref, "fn on the ranks" if mine else "reference_fn",
                             "reference_fn" if mine else "fn on the ranks")
            if said:
                return step, said
            continue
        if not mine:
            continue
        a, b = mine[0], ref[0]
        if math.isfinite(a) and math.isfinite(b) and _differs(a, b, SAME_CLIP):
            return step, _clipped_otherwise(f, step, ranks, a, b)
    return NONE


def _clipped_otherwise(f: UserFacts, step: int, ranks: List[List[float]], a: float, b: float) -> str:
    """Why the sides clipped by other factors, read from the total norms they clipped (the gradients
    before clipping): k x the reference's with k backward passes per step, W x it, or smaller."""
    per_rank = ", ".join(f"{r[0]:.4g}" for r in ranks if r)
    norms = f.rank_clip_norms[step] if step < len(f.rank_clip_norms) else []
    ref_norms = f.ref_clip_norms[step] if step < len(f.ref_clip_norms) else []
    head = f"gradient clipping differs: at step {step} the reference clipped its gradients by a factor of {b:.4g}, the ranks by {per_rank} (rank 0 first)"
    if norms and ref_norms and ref_norms[0] > 0 and math.isfinite(norms[0]):
        ratio = norms[0] / ref_norms[0]
        seen = f"total norms before clipping {norms[0]:.4g} on rank 0 against {ref_norms[0]:.4g}: {ratio:.4g}x"
    elif 0 < a < 1 and 0 < b < 1:  # clipped by hand on one side: the norm each used, from max_norm / factor
        ratio = b / a
        seen = f"the norms the factors imply (max_norm / factor) {ratio:.4g}x"
    else:
        return head + ": the gradients they clip already differ (see the gradients' rows)."
    k = f.rank_backwards
    if k > 1 and abs(ratio - k) <= 0.05 * k:
        return (f"gradient accumulation without dividing the loss (gradients before clipping {ratio:.3g}x the "
                f"reference's, {k} backward passes per step): at step {step} the ranks' gradients before "
                f"clipping are {ratio:.3g}x the reference's ({seen}) with {k} backward passes per step, so each "
                f"micro-batch's loss was not divided by {k}; clipping then scaled by {per_rank} against {b:.4g}, "
                f"hiding part of the factor. Fix: backpropagate loss / {k} for each of the {k} micro-batches.")
    w = f.world_size
    if w > 1 and abs(ratio - w) <= 0.05 * w:
        return (f"{head}, because the ranks' gradients before clipping are {w}x the reference's ({seen}): the loss "
                f"is scaled by the world size, or gradients summed instead of averaged. Fix: backpropagate the "
                "mean loss, and let DDP/FSDP average (or divide an all_reduce SUM by the world size).")
    if ratio < 1:
        fix = ("call torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm) on the DTensor parameters (it "
               "reduces the norm over the mesh)" if f.clips_dtensors else
               "all_reduce the squared local norms before clipping, or clip the whole model's gradients")
        return (f"{head}: the ranks' total norm is smaller ({seen} the reference's): a norm over each rank's "
                f"local shards or part of the parameters only. Fix: {fix}.")
    return (f"{head}: the gradients they clip differ ({seen} the reference's), so look at what made them "
            "differ (the gradients' rows name the tensors); clipping only passes it on.")


def _one_side(step: int, factors: List[float], who: str, other: str) -> str:
    """Clipping seen on one side only: said once it scaled something (a factor below 1)."""
    if not (math.isfinite(factors[0]) and factors[0] < 1):
        return ""
    return (f"gradient clipping differs: at step {step} {who} clipped its gradients by a factor of {factors[0]:.4g} "
            f"(torch.nn.utils.clip_grad_norm_), and no clipping call was seen in {other}: it clips by hand (with "
            "a norm of its local shards, each rank its own factor) or not at all. Fix: call "
            "torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm) on both sides (on DTensor parameters it "
            "reduces the norm over the mesh).")


def state_hint(f: UserFacts) -> Hint:
    """The first step at which the optimizers' state tells of a restart: step counters that differ,
    or one side with no state where the other has some (a fresh optimizer, not restored). How many
    tensors each side holds state for is not evidence by itself: a sharded optimizer (ZeRO, expert
    or FSDP shards) holds a part on each rank from its first step, as long as it trains."""
    for step, (mine, theirs) in enumerate(zip(f.rank_states, f.ref_states)):
        (held, count), (ref_held, ref_count) = mine, theirs
        counters = count >= 0 and ref_count >= 0 and count != ref_count
        fresh = step > 0 and (held == 0) != (ref_held == 0)
        if not (counters or fresh):
            continue
        what = (f"fn on the ranks' optimizer held state for {held} parameter(s) (step count {count:g}), "
                f"reference_fn's for {ref_held} (step count {ref_count:g})")
        return step, (f"the optimizer's state differs: before step {step} {what}. An optimizer built anew and not "
                "restored from the checkpoint starts with no state (Adam's moments zero, step counters "
                "restarted), or one side's state restarted. Fix: save and load the optimizer's state with the "
                "model's (optimizer.state_dict(), or DCP get_optimizer_state_dict/set_optimizer_state_dict).")
    return NONE
