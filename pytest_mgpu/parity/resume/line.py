"""The line a resumed run is judged by. A resume at the same world size on deterministic kernels
reproduces the uninterrupted run bit for bit, and then no line is needed: the verdict is "bitwise
equal". Otherwise (another world size sums in another order; non-deterministic kernels) the
uninterrupted run's companions are run (``phases.py``'s ``line`` phase) and their distances from it
measure the roundoff line, as ``assert_same_training`` measures it. Measured on the resume suite's
trainers at 2 ranks: running the companions every time made the check 6.1x the trainer's own time;
only where needed, it is the cost of the three phases alone.
"""
from __future__ import annotations

from typing import List, Optional

from ..record.loop_companions import LOW
from ..record.loops import same_start, step_gaps
from ..record.recorder import SideLog
from .phases import PhaseResult


def bitwise(uninterrupted: List[SideLog], resumed: List[SideLog], start: int) -> bool:
    """Every rank's loss, gradients and parameters at every resumed step exactly the uninterrupted
    run's at that step (same world size only)."""
    import torch

    if len(uninterrupted) != len(resumed):
        return False
    for u, r in zip(uninterrupted, resumed):
        for i, got in enumerate(r.steps):
            if start + i >= len(u.steps):
                return False
            want = u.steps[start + i]
            if not (got.loss == want.loss or (got.loss != got.loss and want.loss != want.loss)):
                return False
            for mine, theirs in ((got.grads, want.grads), (got.params, want.params)):
                if set(mine) != set(theirs):
                    return False
                for name, t in mine.items():
                    other = theirs[name]
                    if (t is None) != (other is None) or (t is not None and not torch.equal(t, other)):
                        return False
    return all(not last_update_differs(u, r) for u, r in zip(uninterrupted, resumed))


def last_update_differs(uninterrupted: SideLog, resumed: SideLog) -> List[str]:
    """The tensors whose parameters after the last step differ between the two runs (full tensors,
    both recorded): the last step's update, which no later step's record shows."""
    import torch

    mine, theirs = resumed.final, uninterrupted.final
    if not mine or not theirs or set(mine) != set(theirs):
        return []
    return [n for n, t in mine.items() if t is not None and theirs[n] is not None
            and not (t.shape == theirs[n].shape and torch.equal(t, theirs[n]))]


def low_precision(side: SideLog) -> bool:
    return any(d in LOW for d in (side.autocast, side.dtype, side.loss_dtype))


def attach_line(first: PhaseResult, line: PhaseResult) -> None:
    """Fill the uninterrupted run's rank-0 result with its companions' distances and notes."""
    side = first.side
    assert side is not None
    shadow: Optional[SideLog] = line.side
    why = line.floor_notes[0] if line.floor_notes else ""
    if shadow is not None:
        why = same_start(side, shadow)
        if not why:
            first.shadow = step_gaps(side, shadow)
    if not first.shadow:
        first.floor_notes.append(f"no float64 run: {why}")
    first.floor_notes += line.floor_notes[1:]
    if line.twin_side is not None:
        first.twin = step_gaps(side, line.twin_side)
        first.floor_notes.append(
            f"the floor was measured in the loop's own precision ({side.autocast or side.dtype}) by a twin of the "
            "uninterrupted run that sums every matrix product as two halves" + (", beside the float64 run" if first.shadow else ""))
