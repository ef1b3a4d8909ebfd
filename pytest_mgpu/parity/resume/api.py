"""``dist.assert_resumes``: the user's trainer, stopped and resumed, trains like never stopping.

Three phases of ``fn`` on the test's ranks (``phases.py``): uninterrupted for ``steps`` optimizer
steps; interrupted, from scratch, stopped as its (``stop_after`` + 1)-th step begins; resumed, on
``world_size_after`` ranks, in the interrupted phase's folder, until the total reaches ``steps``.
Then ``verdict.py`` judges where it resumed from and every resumed step against the uninterrupted one.
"""
from __future__ import annotations

import dataclasses
from typing import List, Optional

from ...launch.errors import RankFailure
from ..record.loops import LoopJob
from ..layout.mapping import assemble
from ..layout.shards import Shards, validate
from ..records import Portable
from ..report import ParityReport
from .folder import PhaseFolders, listing
from .phases import Phase, PhaseJob, PhaseResult, run_phase
from .digests import EXACT_SUMS, reproduced
from .line import attach_line, bitwise, low_precision
from .verdict import Run, judge_resume, marks_of, resume_point


class ResumeSetupError(AssertionError):
    """A phase took fewer steps than the test asked for: nothing could be judged."""


def assert_resumes(dist, fn, *args, steps: int, stop_after: int, world_size_after: Optional[int] = None,
                   spawn: bool = False, rtol: Optional[float] = None, atol: Optional[float] = None,
                   timeout: Optional[float] = None, shards: Optional[Shards] = None, **kwargs) -> ParityReport:
    """Run ``fn(*args, **kwargs)`` (``spawn=True``: ``fn(rank, *args, **kwargs)``) uninterrupted,
    interrupted after ``stop_after`` steps, and resumed (on ``world_size_after`` ranks); raise
    ParityError where the resume trains otherwise, return the ParityReport of the resumed steps."""
    __tracebackhide__ = True
    after = _validate(steps, stop_after, world_size_after, dist.world_size)
    validate(shards)
    from ...spawn_mode import new_prefix

    def job(phase: Phase, folder: str, **more) -> PhaseJob:
        loop = LoopJob(Portable.of(fn, "fn"), args, kwargs, steps, "optimizer", spawn, new_prefix() if spawn else "")
        return PhaseJob(loop, phase, folder, **more)

    folders = PhaseFolders()
    shared = folders.new("run")
    name = getattr(getattr(fn, "func", fn), "__name__", "fn")
    where = _where(dist, dist.world_size)
    run = Run(name, steps, stop_after, where, _where(dist, after), after, shared)
    digests = after == dist.world_size <= EXACT_SUMS  # where a verdict can read them
    uninterrupted = _phase(dist, job("uninterrupted", folders.new("uninterrupted"), digests=digests),
                           dist.world_size, timeout, run)
    _check_steps("uninterrupted", [r.side and len(r.side.steps) for r in uninterrupted], steps, run)
    interrupted = _phase(dist, job("interrupted", shared, stop_after=stop_after, digests=digests), dist.world_size,
                         timeout, run)
    _check_steps("interrupted", [r.taken for r in interrupted], stop_after, run)
    u0 = uninterrupted[0].side
    assert u0 is not None
    marks = marks_of(u0)  # raises where the uninterrupted run diverged
    resumed = _phase(dist, job("resumed", shared, marks=marks), after, timeout, run)
    if not any(r.side and r.side.steps for r in resumed):
        raise ResumeSetupError(
            f"the resumed run took no optimizer step (in {shared}, which holds {listing(shared)}): the trainer ended "
            f"at once. Did it resume past its last epoch? It must train until {steps} steps in all.")
    uninterrupted, resumed = _assembled(uninterrupted, shards), _assembled(resumed, shards)
    u_sides = [r.side for r in uninterrupted if r.side is not None]
    r_sides = [r.side for r in resumed if r.side is not None]
    start, matched = resume_point(marks, r_sides[0])
    exact = matched and start > 0 and bitwise(u_sides, r_sides, start)
    run = dataclasses.replace(run, reproducible=digests and reproduced(
        [r.digests for r in uninterrupted], [r.digests for r in interrupted], stop_after))
    if matched and start > 0 and not exact and not run.reproducible and rtol is None and atol is None:
        companions = job("line", "", companion_folders=(folders.new("float64"), folders.new("twin")),
                         low=low_precision(u_sides[0]))
        attach_line(uninterrupted[0], _phase(dist, companions, dist.world_size, timeout, run)[0])
    _warn_notes(uninterrupted + interrupted + resumed)
    report = judge_resume(run, uninterrupted, resumed, start, matched, rtol, atol, exact)
    folders.remove()
    return report


def _assembled(results: List[PhaseResult], shards: Optional[Shards]) -> List[PhaseResult]:
    """The phase's results with the tensors ``shards`` names put together from every rank's piece."""
    sides = [r.side for r in results]
    if not shards or any(s is None for s in sides):
        return results
    whole = assemble([s for s in sides if s is not None], shards)
    return [dataclasses.replace(r, side=s) for r, s in zip(results, whole)]


def _validate(steps, stop_after, world_size_after, world: int) -> int:
    __tracebackhide__ = True
    if not isinstance(steps, int) or isinstance(steps, bool) or steps < 2:
        raise ValueError(f"assert_resumes(steps=...) must be an integer of at least 2 (the optimizer steps of the "
                         f"whole run), got {steps!r}")
    if not isinstance(stop_after, int) or isinstance(stop_after, bool) or not 1 <= stop_after < steps:
        raise ValueError(f"assert_resumes(stop_after=...) must be an integer from 1 to steps - 1 = {steps - 1} (the "
                         f"optimizer step after which the run stops), got {stop_after!r}")
    if world_size_after is None:
        return world
    if not isinstance(world_size_after, int) or isinstance(world_size_after, bool) or world_size_after < 1:
        raise ValueError(f"assert_resumes(world_size_after=...) must be a positive integer (the resumed run's "
                         f"ranks) or None (the test's {world}), got {world_size_after!r}")
    return world_size_after


def _where(dist, nprocs: int) -> str:
    plan = getattr(dist, "plan", None)
    text = plan.describe() if plan is not None else f"{dist.world_size} x {dist.device_type}"
    return text.replace(f"{dist.world_size} x", f"{nprocs} x", 1) if nprocs != dist.world_size else text


def _phase(dist, job: PhaseJob, nprocs: int, timeout: Optional[float], run: Run) -> List[PhaseResult]:
    __tracebackhide__ = True
    try:
        return dist.run_on(nprocs, run_phase, job, timeout=timeout)
    except RankFailure as failure:  # dist.run_on named a CUDA-only call already
        failure.what += f" in the {job.phase} phase"
        if job.phase == "resumed":
            failure.what += f" at {nprocs} ranks"
            if nprocs != dist.world_size:
                failure.hint = _reshard_hint(run, dist.world_size, nprocs) + ("\n" + failure.hint if failure.hint else "")
        raise


def _reshard_hint(run: Run, before: int, after: int) -> str:
    return (f"the checkpoint written at {before} ranks did not load at {after}. A file per rank of local shards (torch.save of a sharded model's or optimizer's "
            f"state_dict) cannot load at another world size. Fix: save with torch.distributed.checkpoint "
            "(dcp.save / dcp.load reshard on load), or save one full state dict (get_model_state_dict(model, "
            "options=StateDictOptions(full_state_dict=True, cpu_offload=True))) and load it with "
            f"set_model_state_dict on every rank. The interrupted phase's folder, kept: {run.folder} (it holds "
            f"{listing(run.folder)})")


def _check_steps(phase: str, taken: List, want: int, run: Run) -> None:
    __tracebackhide__ = True
    short = sorted({int(t or 0) for t in taken if int(t or 0) < want})
    if not short:
        return
    raise ResumeSetupError(
        f"assert_resumes(steps={run.steps}, stop_after={run.stop_after}): the {phase} run took {short[0]} optimizer "
        f"step(s), fewer than the {want} it needs. Give the trainer enough data or epochs for {run.steps} optimizer "
        "steps, or ask for fewer steps.")


def _warn_notes(results: List[PhaseResult]) -> None:
    import warnings

    for note in dict.fromkeys(n for r in results for n in r.notes):
        warnings.warn(f"assert_resumes(spawn=True): {note}", RuntimeWarning, stacklevel=4)
