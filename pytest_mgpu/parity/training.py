"""``dist.assert_same_training``: the user's own distributed training loop against their own
one-device loop, step by step, with the same table, tolerance and hints as ``assert_parity``.

The user's loop runs in every rank (their DDP, FSDP, samplers, hand-written all_reduce, or with
``spawn=True`` their ``mp.spawn`` entry point, unchanged) and the reference loop in one process
(``loops.py``). A step is a ``log(model, loss)`` call (``record="log"``) or an ``optimizer.step()``
(``record="optimizer"``: no change to the loops at all). The test process then compares, per step:
- the mean of the ranks' losses with the reference's loss (each rank logs its shard's mean loss);
- rank 0's gradients and parameters with the reference's;
- every other rank's gradients and parameters with rank 0's (replicas that should be equal), as
  rows named ``rank r: <name>``.
The line is measured from the reference's companions (a float64 run, or where that cannot be, a
same-precision twin that only changes the summation order), over the whole run: the loops cannot be
re-synchronized, so the floor has to grow with the run as the model's own chaos does.
A run in which nothing moved (every gradient zero, a constant loss, parameters that never change)
proves nothing and fails (``vacuous.py``).
"""
from __future__ import annotations

import warnings
from typing import Any, Dict, List, Optional, Tuple

from .counts import StepCountError, check_counts  # noqa: F401 - StepCountError: also importable from here
from .engine import ParityError, ParityReport, judge
from .evidence.facts import UserFacts
from .evidence.loss import normalisation
from .judge.sides import compare_sides
from .judge.vacuous import nothing_compared
from .layout.mapping import map_sides
from .layout.shards import Shards, validate
from .record.loops import LoopJob, Record, SideResult, run_loop
from .record.recorder import SideLog
from .records import Portable
from .threads import one_thread

RECORDS = ("log", "optimizer")


def assert_same_training(dist, fn, reference_fn, *args, steps: int = 3, record: Optional[Record] = None,
                         spawn: bool = False, rtol: Optional[float] = None, atol: Optional[float] = None,
                         timeout: Optional[float] = None, fn_kwargs: Optional[Dict[str, Any]] = None,
                         reference_kwargs: Optional[Dict[str, Any]] = None, shards: Optional[Shards] = None,
                         **kwargs) -> ParityReport:
    """``fn`` in every rank against ``reference_fn`` in one process, both called with ``*args,
    **kwargs`` (``record="log"``: with ``log`` first and ``steps=``; ``spawn=True``: ``fn`` with the
    rank first), ``fn_kwargs`` and ``reference_kwargs`` added to one side only (overriding the shared
    ones); ``shards``: tensors sharded by hand that detection cannot put together. Raises ParityError
    where they train differently, returns the ParityReport.
    Orchestrates only: record (both sides) -> map -> judge -> explain -> report."""
    __tracebackhide__ = True
    how = _resolve(steps, record, spawn)
    validate(shards)
    mine, theirs, said = side_keywords(kwargs, fn_kwargs, reference_kwargs)
    from ..spawn_mode import new_prefix

    counted = getattr(dist, "structures", None) is not None  # a structure golden reads the ranks' collectives

    def job(f, what, reference=False):
        return LoopJob(Portable.of(f, what), args, theirs if reference else mine, steps, how, spawn,
                       new_prefix() if spawn else "", reference, counted)

    # the reference beside the ranks where both are CPU processes; the ranks' failure (a CUDA-only call) first
    ranks, ref = dist.run_with_single(run_loop, (job(fn, "fn"),), run_loop, (job(reference_fn, "reference_fn", True),),
                                      timeout=timeout)
    for note in dict.fromkeys(n for side in ranks + [ref] for n in side.notes):
        warnings.warn(f"assert_same_training(spawn=True): {note}", RuntimeWarning, stacklevel=3)
    check_counts([("reference_fn (one process)", ref.side)] +
                  [(f"fn on rank {r}", side.side) for r, side in enumerate(ranks)], steps, how, dist.world_size)
    name = getattr(getattr(fn, "func", fn), "__name__", "fn")  # a functools.partial's function
    keep_structure(dist, name, ranks)
    with one_thread():  # the records are small: threads only wait for each other on a loaded machine
        mapped = map_sides([side.side for side in ranks], ref.side, shards)
        result = compare_sides(mapped, ref, name=name)
        plan = getattr(dist, "plan", None)
        where = plan.describe() if plan is not None else f"{dist.world_size} x {dist.device_type}"
        report = judge(result, result.facts.strategy, dist.world_size, where, rtol, atol, False)
        report.keywords = said
        report.notes += getattr(result.facts, "loop_notes", []) + ref.floor_notes
        _normalised(report)
        if mapped.failed:
            raise ParityError(f"{report.describe()}: {mapped.failure()}\n" + report.format(), report)
        vacuous = nothing_compared([("reference_fn", ref.side)] +
                                   [(f"fn on rank {r}", s.side) for r, s in enumerate(ranks)])
        if vacuous and not report.passed and not nothing_compared([("reference_fn", ref.side)]):
            # the reference trained and the ranks diverge from it: the divergence and its cause lead
            raise ParityError(report.failure_message() + "\n\nnote: " + vacuous, report)
        if vacuous:
            raise ParityError(vacuous + ("" if report.passed else "\n\n" + report.failure_message()), report)
        if not report.passed:
            raise ParityError(report.failure_message(), report)
        return report


def side_keywords(shared: Dict[str, Any], fn_kwargs: Optional[Dict[str, Any]], reference_kwargs: Optional[Dict[str, Any]]
                  ) -> Tuple[Dict[str, Any], Dict[str, Any], str]:
    """The keywords ``fn`` and ``reference_fn`` receive, and how the report names them: a keyword
    passed to ``assert_same_training`` itself reaches both sides (so a bug flag there trains both
    alike); ``fn_kwargs`` / ``reference_kwargs`` reach one side, over the shared ones."""
    for name, value in (("fn_kwargs", fn_kwargs), ("reference_kwargs", reference_kwargs)):
        if value is not None and not isinstance(value, dict):
            raise TypeError(f"{name} must be a dict of keyword arguments, got {type(value).__name__}")
    mine = {**shared, **(fn_kwargs or {})}
    theirs = {**shared, **(reference_kwargs or {})}
    if not (shared or fn_kwargs or reference_kwargs):
        return mine, theirs, ""

    def show(d: Dict[str, Any]) -> str:
        return ", ".join(f"{k}={v!r}"[:60] for k, v in d.items()) or "none"

    if mine == theirs:
        return mine, theirs, (f"both sides got the same keywords: {show(mine)}; a keyword meant for one "
                              "side only goes in fn_kwargs= or reference_kwargs=")
    return mine, theirs, f"keywords: fn got {show(mine)}; reference_fn got {show(theirs)}"


def keep_structure(dist, name: str, ranks: List[SideResult]) -> None:
    """The loop's collectives per rank and step, for the structure goldens (``timing.structure``);
    none where a rank could not cut its steps (``record.counted``): never a partial one. The ranks
    count only where ``dist.structures`` is a list: the test's calls are judged or recorded (a
    counter sends every op of the loop through Python, as much as the loop's own time on a small
    model)."""
    kept = getattr(dist, "structures", None)
    per_rank = {r: side.structure for r, side in enumerate(ranks) if side.structure is not None}
    if kept is None or len(per_rank) != len(ranks):
        return
    from ..timing.structure.figures import of_training

    index = sum(1 for s in kept if s.kind == "training")
    kept.append(of_training(name, index, dist.world_size, per_rank, dist.device_type))


def _resolve(steps, record: Optional[str], spawn: bool) -> Record:
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive integer, got {steps!r}")
    record = record or ("optimizer" if spawn else "log")
    if record not in RECORDS:
        raise ValueError(f"record must be one of {', '.join(map(repr, RECORDS))}, got {record!r}")
    if spawn and record == "log":
        raise ValueError("spawn=True runs an mp.spawn entry point unchanged, which takes no log: "
                         "use record='optimizer' (a step is then one optimizer.step())")
    return "optimizer" if record == "optimizer" else "log"


def _normalised(report: ParityReport) -> None:
    """A loss off by one exact factor at every step while gradients, parameters and the norms
    clipped agree trains alike: the loss is left out of the verdict, and a note says so."""
    k = normalisation(report, report.facts) if isinstance(report.facts, UserFacts) else None
    if k is None:
        return
    for rec in report.records:
        rec.errors = [e for e in rec.errors if e.kind != "loss"]
    report.notes.append(f"the loss was not judged: it is {k:.6g}x the reference's at every step while the gradients "
                        "and parameters agree, a loss normalised otherwise (summed over a tensor-parallel group, divided "
                        "by another count); it trains alike")

