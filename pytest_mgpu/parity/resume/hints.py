"""What a resume did not restore, read from the numbers of the uninterrupted and the resumed run.

Each finding is (cause, fix, evidence), from its own evidence, in the order a resume goes wrong:
the parameters (the state it started from matches no state of the uninterrupted run), the data
position (the rows of a resumed step are those of another step, or of none), the optimizer's state
(tensors held, step counts), the learning rate per step (a scheduler), the number of steps the
resumed run believed it had left, and the random state (dropout, where all the rest was restored).
Steps are counted from 1: "the state after step 8" is the model after 8 optimizer steps.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import FrozenSet, List, Optional, Sequence

from ..record.recorder import SideLog
from .marks import SAME, tensor_distances


@dataclass(frozen=True)
class Finding:
    cause: str
    fix: str
    evidence: str
    fails: bool = False  # a failure by itself, even where every compared step is within the line

    def line(self) -> str:
        return f"{self.cause}. Fix: {self.fix}"

    def short(self) -> str:
        """The cause without its explanation (what a CI page's first lines have room for)."""
        return f"{self.cause.split(': ')[0].split(' (')[0]}. Fix: {self.fix}"


@dataclass
class Resume:
    """The two runs and where the resumed one started (0-based index of the uninterrupted state)."""

    uninterrupted: List[SideLog]  # one per rank
    resumed: List[SideLog]
    start: int
    matched: bool  # the resumed run's first state is that state (within SAME)
    steps: int

    def rows(self, sides: Sequence[SideLog], i: int) -> FrozenSet[float]:
        """Every rank's input rows at step index i, together (rounded: another batch shape may sum
        a row's fingerprint in another order)."""
        return frozenset(float(f"{x:.9g}") for s in sides if i < len(s.steps) for x in s.steps[i].rows)


def findings(run: Resume) -> List[Finding]:
    out = [f for f in (_parameters(run), _data(run), _optimizer(run), _lr(run), _count(run)) if f]
    random = _random(run)  # its evidence is that all the rest was restored
    return out or ([random] if random else [])


def _parameters(run: Resume) -> Optional[Finding]:
    if run.matched:
        return None
    u0, r0 = run.uninterrupted[0], run.resumed[0]
    states = [s.params for s in u0.steps] + [u0.final]
    near = tensor_distances(r0.steps[0].params, states[run.start])
    wrong = [(n, d) for n, d in near if d > SAME]
    initial = {n for n, _ in wrong if dict(tensor_distances({n: r0.steps[0].params[n]}, states[0])).get(n, 1) <= SAME}
    shown = ", ".join(f"{n} ({'as initialised' if n in initial else f'rel {d:.2g}'})" for n, d in wrong[:4])
    return Finding(
        "the model's parameters were not all restored",
        "load the model's whole state_dict from the checkpoint (strict=True) before training resumes",
        f"at its first step the resumed run's parameters match no state of the uninterrupted run; nearest is the "
        f"state after step {run.start}, from which {len(wrong)} of {len(near)} tensor(s) differ: {shown}")


def _data(run: Resume) -> Optional[Finding]:
    n = min(len(run.resumed[0].steps), run.steps - run.start)
    for i in range(n):
        t = run.start + i
        got = run.rows(run.resumed, i)
        if not got or got == run.rows(run.uninterrupted, t):
            continue
        other = next((m for m in range(run.steps) if run.rows(run.uninterrupted, m) == got), None)
        where = f"step {t + 1} ({'the first' if i == 0 else f'the {_nth(i + 1)}'} resumed step)"
        if other is None:
            return Finding(
                "the data order differs after the resume: the sampler's epoch or the random state was not restored",
                "restore the epoch, call sampler.set_epoch(epoch) with it, and restore the random state a shuffle or "
                "augmentation draws from (torch.set_rng_state)",
                f"at {where} the resumed run trained on rows the uninterrupted run used at no step of 1-{run.steps}")
        if other < t:
            return Finding(
                "data repeated after the resume: the data position was not restored",
                "save the epoch (and batch) with the model; resume the data there, with sampler.set_epoch(epoch)",
                f"at {where} the resumed run trained on the rows of step {other + 1} again")
        return Finding(
            "data skipped after the resume: the checkpoint's data position is ahead of its model (the model saved "
            "before its last step, or the step/epoch counter one too far)",
            "save the model, optimizer and step/epoch counter together, after the step they describe",
            f"at {where} the resumed run trained on the rows of step {other + 1}: the rows of step(s) "
            f"{_span(t + 1, other)} were skipped")
    return None


def _optimizer(run: Resume) -> Optional[Finding]:
    if run.start >= len(run.uninterrupted[0].steps) or not run.resumed[0].steps:
        return None
    (held, count), (want_held, want_count) = run.resumed[0].steps[0].state, run.uninterrupted[0].steps[run.start].state
    if held == want_held and count == want_count:
        return None
    what = "was not restored" if held < want_held else "restarted its step count"
    return Finding(
        f"the optimizer's state {what}",
        "save optimizer.state_dict() with the model and load it on resume (DCP: set_optimizer_state_dict)",
        f"before step {run.start + 1} (the first resumed step) the resumed run's optimizer held state for {held} "
        f"parameter(s){_count_word(count)}, the uninterrupted run's for {want_held}{_count_word(want_count)}")


def _lr(run: Resume) -> Optional[Finding]:
    u0, r0 = run.uninterrupted[0], run.resumed[0]
    for i, step in enumerate(r0.steps):
        t = run.start + i
        if t >= len(u0.steps):
            break
        want = u0.steps[t].lrs
        if step.lrs and want and not all(math.isclose(a, b, rel_tol=1e-6) for a, b in zip(step.lrs, want)):
            return Finding(
                "the learning rate was not restored (a scheduler's state not saved or not loaded)",
                "save scheduler.state_dict() in the checkpoint and load it on resume",
                f"lr {_lrs(step.lrs)} at step {t + 1} ({'the first' if i == 0 else f'the {_nth(i + 1)}'} resumed step), "
                f"{_lrs(want)} in the uninterrupted run")
    return None


def _count(run: Resume) -> Optional[Finding]:
    took, needed = len(run.resumed[0].steps), run.steps - run.start
    if not run.matched or took >= needed:
        return None
    return Finding(
        "the resumed run believed it was further than its model: it ended early",
        "restore the epoch/step counter saved with the model, and count from it",
        f"from the state after step {run.start} it needed {needed} step(s) to reach {run.steps}, and ended after {took}",
        fails=True)


def _random(run: Resume) -> Optional[Finding]:
    dropout = run.resumed[0].dropout
    if not dropout:
        return None
    return Finding(
        f"the random state was not restored: dropout ({', '.join(dropout[:3])}) drew other masks after the resume",
        "save torch.get_rng_state() (on GPUs also torch.cuda.get_rng_state_all()) per rank and restore it on resume",
        f"the parameters, optimizer state, lr and rows of step {run.start + 1} match the uninterrupted run's; dropout "
        f"({', '.join(dropout[:3])}) draws from the random state")


def _nth(n: int) -> str:
    return {1: "first", 2: "second", 3: "third"}.get(n, f"{n}th")


def _span(a: int, b: int) -> str:
    return str(a) if a == b else f"{a}-{b}"


def _count_word(count: float) -> str:
    return "" if count < 0 else f" (step count {count:g})"


def _lrs(lrs: Sequence[float]) -> str:
    return "/".join(f"{x:.4g}" for x in dict.fromkeys(lrs))
