"""Nothing compared is not a pass: a run in which nothing moved proves nothing.

Measured before this check: a loss whose gradients are exactly zero at every step (a loss detached
from the model) read as "bitwise equal" for 32 steps, and a loss x world-size bug in the same code
passed with it, because zero times anything is zero. Two runs that both do nothing agree perfectly.
So each side is asked, from its own numbers, whether it trained at all: some gradient nonzero at
some step, a loss that changes, parameters that move. Exact tests, no tolerance: a side that trains
moves its numbers by far more than one ulp.
"""
from __future__ import annotations

import math
from typing import List, Tuple

from ..record.recorder import SideLog

VACUOUS = "nothing was compared"


def zero_grads(side: SideLog) -> bool:
    """Every gradient None or exactly zero at every step."""
    return bool(side.steps) and all(g is None or not bool(g.any()) for s in side.steps for g in s.grads.values())


def constant_loss(side: SideLog) -> bool:
    """The same (finite) loss at every one of two or more steps."""
    losses = [s.loss for s in side.steps]
    return len(losses) > 1 and math.isfinite(losses[0]) and all(x == losses[0] for x in losses)


def never_moved(side: SideLog) -> bool:
    """Every parameter bitwise what it was at step 0, at every later step and after the last."""
    import torch

    if not side.steps or not side.steps[0].params:
        return False
    later = [s.params for s in side.steps[1:]] + ([side.final] if side.final else [])
    if not later:
        return False
    first = side.steps[0].params

    def same(a, b) -> bool:
        return a is None or b is None or torch.equal(a, b)

    return all(same(t, params.get(n)) for params in later for n, t in first.items())


def evidence(side: SideLog) -> List[str]:
    """What shows that this side did not train ([] when it did)."""
    n = len(side.steps)
    found = []
    if zero_grads(side):
        found.append(f"every gradient was exactly zero (or None) at every one of its {n} step(s)")
    if constant_loss(side):
        found.append(f"its loss was {side.steps[0].loss + 0.0:.6g} at every step")  # + 0.0: no "-0"
    if never_moved(side):
        found.append(f"its parameters never moved ({n} step(s){', and after the last' if side.final else ''})")
    return found


def nothing_compared(sides: List[Tuple[str, SideLog]]) -> str:
    """The message that fails a vacuous comparison ("" when every side trained)."""
    bad = [(who, evidence(side)) for who, side in sides]
    bad = [(who, ev) for who, ev in bad if ev]
    if not bad:
        return ""
    shown = "; ".join(f"{who}: {', '.join(ev)}" for who, ev in bad[:3])
    more = f" (and {len(bad) - 3} more side(s))" if len(bad) > 3 else ""
    return (f"{VACUOUS}: {shown}{more}. Two runs that do not train agree trivially, whatever bug they "
            "hold, so equal numbers here prove nothing. Usual causes: a loss detached from the model "
            "(.detach(), .item(), torch.no_grad()), a loss that does not depend on the parameters, a "
            "learning rate of 0, or an optimizer holding other parameters than the model's. Make the "
            "loop train (a nonzero gradient, a loss that changes, parameters that move), then compare.")
