"""Where in a step the gradients were clipped: each side's calls in order (``backward``, ``clip``,
``scaler.unscale_``, recorded between two ``optimizer.step`` calls). A clip belongs after the step's
last backward pass and before its ``optimizer.step``. Read here, on the ranks where the reference
clips in its place:

- a clip that no backward of its step came before: after the previous ``optimizer.step`` (the step
  it meant to clip used the gradients unclipped) or before the backward (it clipped zeros);
- a clip that another backward of the same step follows: each micro-batch's partial sum clipped, where
  the reference clips the whole accumulated gradient once."""
from __future__ import annotations

import math
from typing import List, Optional, Sequence

from .facts import UserFacts
from .finding import Finding, over


def findings(report, f: UserFacts) -> List[Finding]:
    found = _misplaced(report, f)
    return [found] if found is not None else []


def _orders(f: UserFacts, step: int) -> tuple:
    """(rank 0's calls at ``step``, the reference's)."""
    per_rank = f.rank_scaler[step] if step < len(f.rank_scaler) else []
    mine = tuple(per_rank[0][1]) if per_rank and per_rank[0] else ()
    ref = f.ref_scaler[step] if step < len(f.ref_scaler) else ()
    return mine, (tuple(ref[1]) if ref else ())


def early(order: Sequence[str]) -> bool:
    """A clip came before any backward of the step (which had one)."""
    return "clip" in order and "backward" in order and order.index("clip") < order.index("backward")


def between(order: Sequence[str]) -> bool:
    """A clip came between two backward passes of the step."""
    passes = [i for i, c in enumerate(order) if c == "backward"]
    return len(passes) > 1 and any(c == "clip" and passes[0] < i < passes[-1] for i, c in enumerate(order))


def _misplaced(report, f: UserFacts) -> Optional[Finding]:
    steps = len(report.records)
    for step in range(steps):
        mine, ref = _orders(f, step)
        if not mine or "clip" not in mine or "backward" not in ref:
            continue
        if early(mine) and not early(ref):
            norm = _first_norm(f, step)
            at = step - 1 if step > 0 and norm > 0 else step
            if not _moved(report, at):
                continue
            when = (f"after step {at}'s optimizer.step (norm {norm:.4g})" if at < step
                    else "after zero_grad (norm 0)" if norm == 0 else "after a step or zero_grad")
            return Finding(at, "gradients", "a value", "clip-order", f"at step {step} rank 0 clipped before its "
                           f"backward, {when}; the reference after its backward")
        if between(mine) and not between(ref) and _moved(report, step):
            clips, passes = mine.count("clip"), mine.count("backward")
            return Finding(step, "gradients", "a value", "clip-micro",
                           f"at step {step} rank 0 clipped {clips} time(s) among its {passes} backward passes, the "
                           f"reference {ref.count('clip')} time(s), after its last")
    return None


def clipped_next(f: UserFacts, step: int) -> bool:
    """Rank 0 clipped at the start of the next step, before its backward: after this step's
    ``optimizer.step`` (its clip was seen, out of place)."""
    return early(_orders(f, step + 1)[0])


def _first_norm(f: UserFacts, step: int) -> float:
    norms = f.rank_first_norms[step] if step < len(f.rank_first_norms) else []
    return norms[0] if norms and math.isfinite(norms[0]) else math.nan


def _moved(report, step: int) -> bool:
    """The gradients or the weights differ at ``step`` or the next: the misplaced clip changed training."""
    return any(over(report, s, kind) for s in (step, step + 1) if s < len(report.records) for kind in ("grad", "param"))
