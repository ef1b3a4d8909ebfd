"""Where in the user's loop the phase that differs first was made: the line of the call whose hook
recorded it (``record.where``), said in the cause line as ``at train.py:84 (scheduler.step)``.

A phase is made by one call: the rows by the forward, the loss by the backward it is passed to, the
gradients between the backward and the ``optimizer.step`` (where a loop reduces or scales them), the
clipping by ``clip_grad_norm_``, a schedule by ``scheduler.step``, the update by ``optimizer.step``.
The weights a step starts from, an optimizer's arguments and state no optimizer steps are made by
no call a hook sees: nothing is said there, nor where the call was not seen."""
from __future__ import annotations

from typing import Dict, Final, List, Tuple

from ..record.sync import UNSYNCED_LAST
from ..record.where import EVAL_FORWARD, STEP_DEFINED, TRAIN_NO_GRAD
from .conditions import stats_in_train_no_grad
from .facts import REFERENCE, UserFacts
from .finding import Finding

# signal (or its prefix before "-") -> the call kinds that make it; "between" reads two
BY_SIGNAL: Final[Dict[str, Tuple[str, ...]]] = {
    "lr-rank": ("scheduler.step",), "lr-metric": ("scheduler.step",), "lr-metric-loss": ("scheduler.step",),
    "lr-faster": ("scheduler.step",), "lr-schedule": ("scheduler.step",),
    "lr-ahead": ("scheduler.step",), "lr-behind": ("scheduler.step",), "lr-slower": ("scheduler.step",), "lr-frozen": ("scheduler.step",),
    "lr-held": ("scheduler.step",), "lr-plateau": ("scheduler.step",), "lr-warm-up": ("scheduler.step",), "untrained-forward": ("forward",),
    "start-moved": ("optimizer.step",),
    "modes": (EVAL_FORWARD,), "mode": (TRAIN_NO_GRAD,), "grads-sync-off": (UNSYNCED_LAST,),
    "rows": ("forward",), "epoch-repeat": ("forward",), "data-restart": ("forward",), "passes": ("optimizer.step",),
    "loss": ("backward",), "backward": ("backward",), "clip": ("clip_grad_norm_",), "forward": ("forward",),
    "grads-carried": ("backward",), "grads-zeroed-micro": ("backward",),
    "grads": ("backward", "optimizer.step"), "stage": ("backward",), "clip-by-hand": ("backward", "optimizer.step"),
    "update-rank": ("optimizer.step",), "update-other": ("optimizer.step",),
    "update-foreign": ("optimizer.step",), "update-frozen": ("optimizer.step",), "update-inside": ("optimizer.step",),
}
SHOWN: Final = 2  # locations of one kind said at most (a training and a validation forward)


def kinds_of(signal: str) -> Tuple[str, ...]:
    return BY_SIGNAL.get(signal) or BY_SIGNAL.get(signal.split("-", 1)[0], ())


def _rank_of(x: Finding) -> int:
    """The rank a one-rank finding names; rank 0 otherwise."""
    if x.how == "one rank alone" and x.names and x.names[0].isdigit():
        return int(x.names[0])
    return 0


def _lines(per_step: List[Dict[str, Tuple[str, ...]]], step: int, kind: str) -> Tuple[str, ...]:
    """The locations of ``kind`` at ``step``, or at the nearest step that has some."""
    order = [step] + [s for s in range(len(per_step)) if s != step]
    for s in order:
        if 0 <= s < len(per_step) and per_step[s].get(kind):
            return per_step[s][kind]
    return ()


def _side(f: UserFacts, x: Finding, kind: str) -> Tuple[Tuple[str, ...], str]:
    """(locations, whose): the ranks' (the rank the finding names first, then the others: a call made on
    some ranks only), else the reference's."""
    first = _rank_of(x)
    world = max((len(per_rank) for per_rank in f.rank_where), default=0)
    for r in [first] + [r for r in range(world) if r != first]:
        got = _lines([per_rank[r] if r < len(per_rank) else {} for per_rank in f.rank_where], x.step, kind)
        if got:
            return got, ""
    return _lines(f.ref_where, x.step, kind), REFERENCE


def joined(lines) -> str:
    """``a.py:84, :90``: several locations, a file named once where they share it."""
    out = [lines[0]]
    for line in lines[1:]:
        same = line.split(":", 1)[0] == lines[0].split(":", 1)[0]
        out.append(line[len(line.split(":", 1)[0]):] if same else line)
    return ", ".join(out)


def _defined(f: UserFacts) -> str:
    """Where the step of the loop's one optimizer of its own is written (``Muon.step at train.py:40``); ""
    where the loop steps none, or several (which one made the update is not told apart)."""
    seen = {line for per_step in f.rank_where for where in per_step for line in where.get(STEP_DEFINED, ())}
    return next(iter(seen)) if len(seen) == 1 else ""


def located(x: Finding, f: UserFacts) -> str:
    """``"at train.py:84 (scheduler.step)"`` for the finding's phase, ``"at train.py:80 (backward) to :83
    (optimizer.step)"`` for the gradients; "" where no call made it or none was seen."""
    if x.line:
        return f"at {x.line}"
    kinds = kinds_of(x.signal)
    if x.signal.startswith("untrained") and stats_in_train_no_grad(x, f):
        kinds = (TRAIN_NO_GRAD,)  # running statistics updated by that forward
    said: List[str] = []
    for kind in kinds:
        lines, whose = _side(f, x, kind)
        if lines:
            own = _defined(f) if kind == "optimizer.step" and x.signal.startswith("update") else ""
            call = f"{kind}; {own}" if own else kind  # an optimizer of the user's own: where its step is written
            said.append(f"{joined(lines[:SHOWN])} ({call}{' in ' + whose if whose else ''})")
    if not said:
        return ""
    if len(said) == 2:
        head = said[0].split(":", 1)[0] + ":"
        later = said[1][len(head) - 1:] if said[1].startswith(head) else said[1]  # one file: named once
        return f"at {said[0]} to {later}"
    return f"at {said[0]}"

