"""The test process's judgement of a resume: where the resumed run started, whether it resumed at
all, and its steps against the uninterrupted run's steps from there on.

The uninterrupted run plays the reference of ``assert_same_training``: its ranks' losses combined as
their layout holds them, rank 0's gradients and parameters, and the line measured by its float64 run
(or twin) in the ranks. The resumed ranks are compared with it step by step from the state they
started from, with the same table and tolerance; steps are numbered from 1 (the table's step 9 is the
9th optimizer step of the uninterrupted run, the first after "the state after step 8").
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import List, Tuple

from ...brief import fit
from ..engine import ParityError, ParityReport, judge
from ..message import divergence_table, summary_table
from ..evidence.causes import likely_causes
from ..layout.groups import Layout
from ..judge.tolerance import Tolerance
from ..judge.vacuous import nothing_compared
from ..record.loops import SideResult
from ..record.recorder import SideLog, StepLog
from ..judge.sides import compare_sides
from ..layout.mapping import map_sides
from .hints import Finding, Resume, findings
from .marks import SAME, Mark, closest, finite, mark
from .line import last_update_differs
from .phases import PhaseResult

NOTHING = "nothing was resumed"


@dataclass(frozen=True)
class Run:
    """What the test asked for and where each phase ran."""

    name: str  # the trainer's name
    steps: int
    stop_after: int
    where: str  # the uninterrupted and interrupted phases' ranks, e.g. "4 x cpu (gloo, emulated)"
    where_after: str  # the resumed phase's
    world_after: int
    folder: str  # the interrupted and resumed phases' folder
    reproducible: bool = False  # same world size, and the interrupted phase's steps were the uninterrupted's bit for bit


class UninterruptedDiverged(AssertionError):
    """The uninterrupted run's parameters went to inf or NaN: no resume can be judged against it."""


def marks_of(uninterrupted: SideLog) -> Tuple[Mark, ...]:
    """The marks of every state of the uninterrupted run: before step 1, after step 1, ... after step N."""
    __tracebackhide__ = True  # the failure is the test's line, not the plugin's source
    states = tuple(mark(s.params) for s in uninterrupted.steps) + (mark(uninterrupted.final),)
    bad = next((i for i, state in enumerate(states) if not finite(state)), None)
    if bad is not None:
        raise UninterruptedDiverged(
            f"the uninterrupted run's parameters hold inf or NaN {'from the start' if bad == 0 else f'after step {bad}'}: "
            "no resume can be judged against a run that diverged. Make the trainer train stably (a lower learning "
            "rate, gradient clipping), or stop the test before that step.")
    return states


def resume_point(states: Tuple[Mark, ...], resumed: SideLog) -> Tuple[int, bool]:
    """(the uninterrupted state the resumed run's first step starts from, whether it is that state)."""
    start, d = closest(mark(resumed.steps[0].params), states)
    return start, d <= SAME


def reference(sides: List[SideLog], first: PhaseResult, start: int, count: int) -> SideResult:
    """The uninterrupted run from state ``start`` on, for ``count`` steps, as the reference side: the
    ranks' combined loss, rank 0's tensors, and its companions' distances."""
    layout = Layout.of(sides)
    rank0 = sides[0]
    steps: List[StepLog] = []
    for t in range(start, min(start + count, len(rank0.steps))):
        own = rank0.steps[t]
        loss = layout.loss(t, [s.steps[t] for s in sides])
        steps.append(StepLog(own.loss if loss is None else loss, own.grads, own.params, own.rows, own.backwards,
                             own.lrs, own.clips, own.state))
    side = SideLog(steps=steps, batchnorm=rank0.batchnorm, dropout=rank0.dropout, dtype=rank0.dtype,
                   autocast=rank0.autocast, loss_dtype=rank0.loss_dtype)
    return SideResult(side, shadow=first.shadow[start:start + count], twin=first.twin[start:start + count],
                      floor_notes=list(first.floor_notes))


def judge_resume(run: Run, uninterrupted: List[PhaseResult], resumed: List[PhaseResult], start: int,
                 matched: bool, rtol, atol, exact: bool = False) -> ParityReport:
    """The report; raises ParityError where nothing was resumed or the resumed run trains otherwise."""
    __tracebackhide__ = True  # the failure is the test's line, not the plugin's source
    u_sides = [r.side for r in uninterrupted if r.side is not None]
    r_sides = [r.side for r in resumed if r.side is not None]
    facts = Resume(u_sides, r_sides, start, matched, run.steps)
    ref = reference(u_sides, uninterrupted[0], start, len(r_sides[0].steps))
    result = compare_sides(map_sides(r_sides, ref.side), ref, name=run.name)
    for rec in result.records:
        rec.step += start + 1
    report = judge(result, result.facts.strategy, run.world_after, run.where_after, rtol, atol, False)
    if exact:
        report.tolerance = Tolerance(0.0, 0.0, "the resumed run reproduced the uninterrupted run bit for bit", "bitwise")
    elif run.reproducible and rtol is None and atol is None:
        report.tolerance = Tolerance(0.0, 0.0, f"a correct resume on these kernels is bitwise equal here: the "
                                               f"interrupted run's first {run.stop_after} steps reproduced the "
                                               "uninterrupted run's exactly", "bitwise")
    report.against = "the uninterrupted run"
    report.notes.insert(0, started(run, start, matched))
    report.notes += [n.replace("in fn on the ranks", "in the resumed run").replace("fn on the ranks:", "the resumed run:")
                     for n in getattr(result.facts, "loop_notes", [])] + ref.floor_notes
    if matched and start == 0:
        from .folder import listing

        raise ParityError(f"{NOTHING}: the resumed run started from the initial parameters (no checkpoint found in "
                          f"{run.folder}, or it was not loaded). The folder holds: {listing(run.folder)}.\nA resume "
                          "test needs the trainer to save a checkpoint before the stop at step "
                          f"{run.stop_after} and to load it when it starts again.", report)
    found = findings(facts)
    vacuous = nothing_compared([("the uninterrupted run", ref.side)] + [(f"the resumed run on rank {r}", s)
                                                                         for r, s in enumerate(r_sides)])
    if vacuous:
        raise ParityError(vacuous, report)
    if not report.passed or (found and not matched) or any(f.fails for f in found):
        raise ParityError(failure_message(run, report, found), report)
    last = last_update_differs(u_sides[0], r_sides[0]) if run.reproducible and report.exact else []
    if last:
        raise ParityError(
            f"not bitwise: after the last step (step {run.steps}) the resumed run's parameters differ from the "
            f"uninterrupted one's ({len(last)} tensor(s), e.g. {last[0]}), whose first {run.stop_after} steps the "
            f"interrupted run reproduced exactly: the last step's update differs (a learning rate or optimizer "
            f"state not restored, e.g. a scheduler whose state was not loaded)\n" + "\n".join(report.notes)
            + f"\nthe checkpoints are kept in {run.folder}", report)
    return report


def _ordinal(n: int) -> str:
    return {1: "the first", 2: "the second", 3: "the third"}.get(n, f"the {n}th")


def started(run: Run, start: int, matched: bool) -> str:
    if not matched:
        return (f"the resumed run started from no state of the uninterrupted run (nearest: the state after step "
                f"{start}; the stop was at step {run.stop_after})")
    return f"resumed from the state after step {start} (the last checkpoint before the stop at step {run.stop_after})"


def failure_message(run: Run, report: ParityReport, found: List[Finding]) -> str:
    failures = report.failures()
    ranks = run.where if run.where == run.where_after else f"{run.where} -> {run.where_after}"
    head = f"{run.name} stopped after step {run.stop_after} of {run.steps} and resumed ({ranks}) "
    if failures and report.exact and run.reproducible:
        first = failures[0][0]
        bad = len({(e.kind, e.name) for s, e, _ in failures if s == first})
        nth = first - min(rec.step for rec in report.records) + 1
        head = (f"not bitwise: at step {first} ({_ordinal(nth)} resumed step) the resumed run differs from the "
                f"uninterrupted one, whose first {run.stop_after} steps the interrupted run reproduced exactly")
    elif failures:
        first = failures[0][0]
        bad = len({(e.kind, e.name) for s, e, _ in failures if s == first})
        head += f"diverges from the uninterrupted run at step {first}"
    else:
        head += "trains like the uninterrupted run where both ran, but not for the steps asked"
    head += f" ({bad} tensor(s) over the line)" if failures and not head.startswith("not bitwise") else ""
    generic = likely_causes(report)
    cause = found[0].short() if found else generic[0]
    top = [head, f"likely cause: {cause if len(cause) <= 300 else cause[:297] + '...'}", *([found[0].evidence] if found else []), report.notes[0]]
    lines = fit(top) + [
        f"tolerance: {report.tolerance.describe()}",
        *[f"note: {n}" for n in report.notes[1:]],
        f"the checkpoints are kept in {run.folder}",
    ]
    if failures:
        lines += ["", divergence_table(report), "", "per step: the worst norm rel err of each kind; worst / line "
                  "(> 1 fails):", summary_table(report)]
    lines += ["", "likely causes:"] + [f"  - {f.line()} ({f.evidence})" for f in found]
    lines += [f"  - {h}" for h in generic if failures and not found]
    return "\n".join(lines)
