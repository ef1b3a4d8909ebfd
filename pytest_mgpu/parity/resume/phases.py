"""The rank side of ``dist.assert_resumes``: one phase of the user's trainer in this rank.

- ``uninterrupted``: the trainer for N optimizer steps, recorded as ``record="optimizer"`` records
  them.
- ``line``: only where the resumed run is not bitwise equal to the uninterrupted one (another world
  size, non-deterministic kernels): the uninterrupted run's companions (a float64 run, or a
  same-precision twin) that measure the roundoff line, each in a folder of its own.
- ``interrupted``: the trainer from scratch, stopped as its (K+1)-th optimizer step begins: what it
  does after its K-th step (an end-of-epoch save) has happened. Nothing is recorded but the count and
  a digest of each rank's parameters per step (``digests.py``: did the run reproduce itself?).
- ``resumed``: the trainer again in the interrupted phase's folder. At its first step it finds which
  state of the uninterrupted run it starts from (``marks.py``) and stops when the total reaches N.

Every phase starts from the test's seed, as a fresh process would.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, field
from typing import Any, Callable, List, Literal, Optional, Tuple

from ..record.loop_companions import split_sums
from ..precision import ieee_float32
from ..record.loops import Gaps, LoopJob, run_shadow, run_side
from ..record.recorder import SideLog
from ..record.step_recorder import StepRecorder, StopTraining
from .digests import Digests, could_train
from .folder import in_folder
from .marks import Mark, closest, mark

Phase = Literal["uninterrupted", "interrupted", "resumed", "line"]


@dataclass(frozen=True)
class PhaseJob:
    """One phase, as every rank receives it."""

    loop: LoopJob  # the trainer, its arguments, N, spawn, its store prefix
    phase: Phase
    folder: str
    companion_folders: Tuple[str, str] = ("", "")  # line: the float64 run's, the twin's
    low: bool = False  # line: the trainer computes in a low precision (a twin runs beside the float64 run)
    stop_after: int = 0  # interrupted: K
    marks: Tuple[Mark, ...] = ()  # resumed: the uninterrupted run's states 0..N
    digests: bool = False  # uninterrupted, interrupted: hash each rank's parameters per step (digests.py)


@dataclass
class PhaseResult:
    """What one rank sends back from a phase."""

    side: Optional[SideLog] = None
    notes: List[str] = field(default_factory=list)  # what the spawn redirect changed
    shadow: List[Gaps] = field(default_factory=list)
    twin: List[Gaps] = field(default_factory=list)
    floor_notes: List[str] = field(default_factory=list)
    twin_side: Optional[SideLog] = None  # line: the same-precision twin's record (rank 0)
    taken: int = 0  # interrupted: the optimizer steps taken before the stop
    loaded: List[str] = field(default_factory=list)  # resumed: the files torch.load read
    digests: List[str] = field(default_factory=list)  # uninterrupted, interrupted: this rank's, per step


class ResumeFailed(RuntimeError):
    """The resumed phase raised after loading files: which ones, and what it raised."""


class StopBefore(StepRecorder):
    """Counts the optimizer steps that train (some lr above 0, some gradient nonzero) and raises
    StopTraining as the (K+1)-th begins; records nothing."""

    def __init__(self, after: int, watch) -> None:
        super().__init__(after, watch)
        self.after, self.taken, self.depth = after, 0, 0

    def _pre(self, optimizer, args, kwargs) -> None:
        self.depth += 1
        if self.depth == 1 and self.taken >= self.after and could_train(optimizer):
            self.depth = 0
            raise StopTraining(f"stopped before optimizer step {self.after + 1}")

    def _post(self, optimizer, args, kwargs) -> None:
        self.depth -= 1
        if self.depth == 0 and could_train(optimizer):
            self.taken += 1


class ResumedSteps(StepRecorder):
    """``record="optimizer"`` for the resumed run: at its first counted step, the state it starts
    from (the closest mark), and from it the steps left to reach N."""

    def __init__(self, total: int, marks: Tuple[Mark, ...], watch) -> None:
        super().__init__(total, watch)
        self.total, self.marks = total, marks

    def _pre(self, optimizer, args, kwargs) -> None:
        super()._pre(optimizer, args, kwargs)
        if len(self.side.steps) == 1 and self.marks:  # again after a step set aside (DCP's state init)
            start, _ = closest(mark(self.side.steps[0].params), self.marks)
            self.steps = self.total - start if 0 < start < self.total else self.total


def run_phase(job: PhaseJob) -> PhaseResult:
    """Runs in every rank of the phase (float32 as IEEE float32: ``parity.precision``)."""
    with ieee_float32():
        return _run_phase(job)


def _run_phase(job: PhaseJob) -> PhaseResult:
    from ..._context import rank_context
    from ...launch.rank import seed_everything

    ctx = rank_context()
    fn = job.loop.fn.load()
    seed_everything(ctx.seed)
    if job.phase == "interrupted":
        return _interrupted(job, fn, ctx.rank)
    if job.phase == "resumed":
        return _resumed(job, fn, ctx.rank)
    if job.phase == "line":
        return _line(job, fn, ctx.rank, ctx.seed)
    with in_folder(job.folder), Digests(job.digests).installed() as seen:
        side, notes = run_side(job.loop, fn, ctx.rank)
    return PhaseResult(side, notes, digests=seen.digests)


def _line(job: PhaseJob, fn, rank: int, seed: int) -> PhaseResult:
    """The uninterrupted run's companions, each in its own folder: the float64 run, and where it cannot
    run or the trainer computes in a low precision, the same-precision twin. Rank 0 sends its records;
    the test process measures their distances from the uninterrupted run."""
    from ...launch.rank import seed_everything

    shadow_dir, twin_dir = job.companion_folders
    with in_folder(shadow_dir):
        shadow, why = run_shadow(job.loop, fn, seed, rank)
    out = PhaseResult(side=shadow if rank == 0 else None, floor_notes=[why] if why else [])
    if shadow is not None and not job.low:
        return out
    seed_everything(seed)
    try:
        with in_folder(twin_dir):
            twin, _ = run_side(job.loop, fn, rank, "twin/", split_sums())
    except Exception as exc:  # noqa: BLE001 - no twin, say why
        out.floor_notes.append(f"no same-precision twin either ({type(exc).__name__}: {exc})")
        return out
    out.twin_side = twin if rank == 0 else None
    return out


def _interrupted(job: PhaseJob, fn, rank: int) -> PhaseResult:
    made: List[StopBefore] = []

    def recorder(watch) -> StepRecorder:
        made.append(StopBefore(job.stop_after, watch))
        return made[-1]

    with in_folder(job.folder), Digests(job.digests).installed() as seen:
        _, notes = run_side(job.loop, fn, rank, recorder=recorder, watched=False)
    return PhaseResult(notes=notes, taken=made[-1].taken if made else 0, digests=seen.digests)


def _resumed(job: PhaseJob, fn, rank: int) -> PhaseResult:
    loaded: List[str] = []
    with in_folder(job.folder), _loads_seen(loaded):
        try:
            side, notes = run_side(job.loop, fn, rank,
                                   recorder=lambda watch: ResumedSteps(job.loop.steps, job.marks, watch))
        except Exception as exc:
            if not loaded:
                raise
            files = ", ".join(dict.fromkeys(loaded))
            raise ResumeFailed(f"the resumed trainer raised {type(exc).__name__} after loading {files}: {exc}") from exc
    return PhaseResult(side, notes, loaded=loaded)


@contextlib.contextmanager
def _loads_seen(loaded: List[str]):
    """Note the path of every ``torch.load`` the trainer makes (names the file a failure came from)."""
    import torch

    real: Callable[..., Any] = torch.load

    def load(f, *args, **kwargs):
        if isinstance(f, (str, os.PathLike)):
            path = os.path.abspath(os.fspath(f))
            inside = path.startswith(os.getcwd() + os.sep)
            loaded.append(os.path.relpath(path) if inside else path)  # the phase's folder is the cwd
        return real(f, *args, **kwargs)

    torch.load = load
    try:
        yield
    finally:
        torch.load = real
