"""How each side ran the step where the tensors first diverge, read as facts of the run: the mode of
its training forward (``eval()`` left on after a validation pass), a forward under ``no_grad`` in
training mode (a validation pass without ``eval()``: its dropout draws random numbers, its BatchNorm
updates running statistics), backward passes the ranks run at that step beyond their own count
at the steps before (a validation loss backpropagated), and a last backward with gradient
synchronisation off (``no_sync()`` or ``set_requires_gradient_sync(False)`` left on).

Said only at the first step that diverges: the same fact at an earlier step that agreed shows it
changed nothing there (validation on rank 0 alone, with nothing fed back into training)."""
from __future__ import annotations

from typing import Dict, List, Optional, Tuple

from ..record.sync import UNSYNCED_LAST
from ..record.where import EVAL_FORWARD, TRAIN_NO_GRAD
from .facts import UserFacts
from .finding import Finding, Report

Where = Dict[str, Tuple[str, ...]]


def findings(report: Report, f: UserFacts, step: Optional[int]) -> List[Finding]:
    """The facts of ``step``: the first that diverges (past a loss counted otherwise beside the same
    gradients: where training diverges)."""
    if step is None or step >= len(f.rank_where) or not f.rank_where[step]:
        return []
    ranks: List[Where] = f.rank_where[step]
    ref: Where = f.ref_where[step] if step < len(f.ref_where) else {}
    out = [_training_mode(step, ranks, ref), _validation_mode(step, ranks, ref), _extra_backward(step, f),
           _unsynced(step, ranks, f)]
    return [x for x in out if x is not None]


def _who(ranks: List[Where], kind: str) -> Tuple[str, Optional[int]]:
    """("the ranks" | "rank r", its rank where one rank alone) of those whose step holds ``kind``."""
    holding = [r for r, w in enumerate(ranks) if w.get(kind)]
    if len(holding) == len(ranks):
        return "the ranks", None
    return ("rank " + ", ".join(map(str, holding)), holding[0]) if holding else ("", None)


def _trained_in_eval(w: Where) -> bool:
    """Every forward with gradients of the step ran with modules in eval mode (none in training mode at
    another line: a forward with gradients in eval mode beside a training one is another pass)."""
    return bool(w.get(EVAL_FORWARD)) and not set(w.get("forward", ())) - set(w[EVAL_FORWARD])


def _training_mode(step: int, ranks: List[Where], ref: Where) -> Optional[Finding]:
    """The training forward ran with modules in eval mode on one side only."""
    ranks = [w if _trained_in_eval(w) else {k: v for k, v in w.items() if k != EVAL_FORWARD} for w in ranks]
    ref = ref if _trained_in_eval(ref) else {k: v for k, v in ref.items() if k != EVAL_FORWARD}
    who, alone = _who(ranks, EVAL_FORWARD)
    if who and not ref.get(EVAL_FORWARD) and ref.get("forward"):
        return Finding(step, "state", "a value" if alone is None else "one rank alone", "modes",
                       f"at step {step} the training forward of {who} ran with modules in eval mode, the "
                       "reference's in training mode",
                       names=() if alone is None else (str(alone),))
    if ref.get(EVAL_FORWARD) and not any(w.get(EVAL_FORWARD) for w in ranks) and any(w.get("forward") for w in ranks):
        return Finding(step, "state", "a value", "modes",
                       f"at step {step} the reference's training forward ran with modules in eval mode, the ranks' "
                       "in training mode")
    return None


def _validation_mode(step: int, ranks: List[Where], ref: Where) -> Optional[Finding]:
    """A forward under no_grad (validation) in training mode on the ranks, in eval mode in the reference."""
    who, alone = _who(ranks, TRAIN_NO_GRAD)
    if who and ref.get("forward under no_grad") and not ref.get(TRAIN_NO_GRAD):
        return Finding(step, "state", "a value" if alone is None else "one rank alone", "mode-validation",
                       f"before step {step}'s update a forward under no_grad ran in training mode on {who}, in eval "
                       "mode in the reference", names=() if alone is None else (str(alone),))
    return None


def _extra_backward(step: int, f: UserFacts) -> Optional[Finding]:
    """The ranks backpropagate more scalars at ``step`` than at the steps before, and the reference does not."""
    if step == 0 or step >= len(f.rank_step_backwards) or step >= len(f.ref_step_backwards):
        return None
    now, before = f.rank_step_backwards[step], f.rank_step_backwards[0]
    ref_now, ref_before = f.ref_step_backwards[step], f.ref_step_backwards[0]
    more = [r for r, (n, b) in enumerate(zip(now, before)) if n > b]
    if not more or ref_now > ref_before:
        return None
    who = "the ranks" if len(more) == len(now) else "rank " + ", ".join(map(str, more))
    r = more[0]
    now_lines, first_lines = (per_rank[r].get("backward", ()) if r < len(per_rank) else ()
                              for per_rank in (f.rank_where[step], f.rank_where[0]))
    new = [line for line in now_lines if line not in first_lines]
    where = f" (a backward at {', '.join(new[:2])} that step 0 did not run)" if new else ""
    return Finding(step, "loss", "a value" if len(more) == len(now) else "one rank alone", "backward-extra",
                   f"at step {step} {who} backpropagated {now[r]} losses, {before[r]} at step 0{where}; the "
                   f"reference {ref_now} and {ref_before}", names=() if len(more) == len(now) else (str(r),))


def _unsynced(step: int, ranks: List[Where], f: UserFacts) -> Optional[Finding]:
    """The step's last backward ran with gradient synchronisation off (``no_sync()``, FSDP2's
    ``set_requires_gradient_sync(False)``): nothing reduced its gradients."""
    who, alone = _who(ranks, UNSYNCED_LAST)
    if not who or f.world_size < 2:
        return None
    return Finding(step, "gradients", "a value" if alone is None else "one rank alone", "grads-sync-off",
                   f"at step {step} the last backward before optimizer.step ran with gradient synchronisation off "
                   f"on {who}", names=() if alone is None else (str(alone),))
