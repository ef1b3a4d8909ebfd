"""Hints from what the optimizer was told at each step (test process): the learning rate each side
stepped with (a scheduler stepped per micro-batch, not restored, restarted) and the factor each
side's gradient clipping scaled by (a norm computed over one rank's shards only)."""
from __future__ import annotations

import math
from typing import List, Optional

from .hints import UserFacts

SAME_LR = 1e-9  # relative: one schedule computes the same float on both sides
SAME_CLIP = 1e-2  # relative: a clip factor from the same norm, up to the sides' roundoff


def _differs(a: float, b: float, rel: float) -> bool:
    return abs(a - b) > rel * max(abs(a), abs(b), 1e-30)


def _lr_at(lrs: List[List[float]], step: int) -> Optional[float]:
    return lrs[step][0] if step < len(lrs) and lrs[step] else None


def schedule_hint(f: UserFacts) -> str:
    """The first step at which the sides stepped with other learning rates, and what that looks like."""
    steps = min(len(f.rank_lrs), len(f.ref_lrs))
    first = next((s for s in range(steps) if f.rank_lrs[s] and f.ref_lrs[s] and
                  any(_differs(a, b, SAME_LR) for a, b in zip(f.rank_lrs[s], f.ref_lrs[s]))), None)
    if first is None:
        return ""
    mine, theirs = f.rank_lrs[first][0], f.ref_lrs[first][0]
    shown = ", ".join(f"{_lr_at(f.rank_lrs, s):.4g}/{_lr_at(f.ref_lrs, s):.4g}" for s in range(min(steps, 6)))
    head = (f"the learning rate differs: at step {first} fn on the ranks stepped with lr {mine:.6g}, reference_fn "
            f"with {theirs:.6g} (ranks/reference per step: {shown}{', ...' if steps > 6 else ''}). ")
    faster = _faster(f, steps)
    if faster:
        return head + (f"The ranks' schedule runs {faster}x as fast as the reference's (its lr at step s is the "
                       f"reference's at step {faster}s): the scheduler is stepped per micro-batch (or per "
                       f"{faster} calls) instead of once per optimizer step. Fix: call scheduler.step() right "
                       "after optimizer.step(), once per step.")
    return head + ("A scheduler stepped at another rate, created with other arguments, restarted, or not restored "
                   "with a checkpoint (its state_dict saved and loaded beside the optimizer's), or another base lr "
                   "or warm-up on one side. Fix: step and restore the scheduler alike on both sides.")


def _faster(f: UserFacts, steps: int) -> int:
    """k > 1 where the ranks' lr at every step s is the reference's at step k*s (0: no such k)."""
    for k in (2, 3, 4, 8):
        pairs = [(f.rank_lrs[s][0], f.ref_lrs[k * s][0]) for s in range(steps)
                 if k * s < len(f.ref_lrs) and f.rank_lrs[s] and f.ref_lrs[k * s]]
        if len(pairs) >= 2 and all(not _differs(a, b, SAME_LR) for a, b in pairs):
            return k
    return 0


def clip_hint(f: UserFacts) -> str:
    """The first step at which the sides' gradient clipping scaled by other factors."""
    for step, (ranks, ref) in enumerate(zip(f.rank_clips, f.ref_clips)):
        mine = ranks[0] if ranks else []
        if not mine and not ref:
            continue
        if bool(mine) != bool(ref):
            who, other = ("fn on the ranks", "reference_fn") if mine else ("reference_fn", "fn on the ranks")
            return (f"gradient clipping on one side only: at step {step} {who} clipped its gradients "
                    f"(torch.nn.utils.clip_grad_norm_) and {other} did not. Fix: clip alike on both sides.")
        a, b = mine[0], ref[0]
        if math.isfinite(a) and math.isfinite(b) and _differs(a, b, SAME_CLIP):
            per_rank = ", ".join(f"{r[0]:.4g}" for r in ranks if r)
            return (f"gradient clipping differs: at step {step} the reference clipped its gradients by a factor of "
                    f"{b:.4g}, the ranks by {per_rank} (rank 0 first). A factor set by another total norm: the "
                    "ranks compute the norm over their local shards only (clip_grad_norm_ over to_local() tensors, "
                    "or over one rank's parameters), which is smaller than the whole model's. Fix: call "
                    "torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm) on the DTensor parameters (it "
                    "reduces the norm over the mesh), or all_reduce the squared local norms before clipping.")
        return ""
    return ""
