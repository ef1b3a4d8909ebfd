"""One side of ``assert_same_training`` as it runs in a rank (the user's distributed loop) or in the
reference's one process (their one-device loop, and its companions): which recorder watches it
(``record="log"``: the loop calls ``log``; ``"optimizer"``: every ``optimizer.step()``), how it is
called (``spawn=True``: as ``mp.spawn`` calls an entry point, with no process group up), and, for
the reference, the runs that measure the floor (``loop_companions``), whose distances from the
reference are computed here, in that process, so that only numbers cross back. Those runs are
recorded light (``run_side(light=True)``): each step's loss, gradients, parameters and learning rates,
all their distances read, the same values as the full recorder's.
"""
from __future__ import annotations

import contextlib
import math
import os
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, List, Literal, Optional, Sequence, Tuple

from ..judge.distance import gap
from ..precision import ieee_float32
from .counted import LoopStructure
from .float64_kernels import float64_kernels
from .norms import BatchNormRows
from .loop_companions import LOW, PinsFound, float64_dispatch, split_products, split_sums
from .recorder import Recorder, SideLog
from ..records import Portable
from .step_recorder import StepRecorder, StopTraining
from .watch import Watch

Record = Literal["log", "optimizer"]
Gaps = Dict[Tuple[str, str], float]  # (kind, name) -> ||reference - companion||

# The float64 run starts from the float32 run's weights (the same random draws, widened), so its
# step-0 parameters differ by the rounding of the init arithmetic alone (~1e-7 relative). A larger
# gap means the loop built its model from something the shadow did not reproduce (a clock, a file,
# os.urandom): then its distance is not roundoff, and judging by it would forgive any bug.
SAME_START = 1e-4
# Calibration only: "both" runs the twin beside a working float64 shadow (benchmarks/parity/parity_calibration.py).
COMPANIONS_ENV = "PYTEST_MGPU_PARITY_COMPANIONS"


@dataclass(frozen=True)
class LoopJob:
    """One side's loop, as the ranks (or the one reference process) receive it."""

    fn: Portable
    args: tuple
    kwargs: Dict[str, Any]
    steps: int
    record: Record = "log"
    spawn: bool = False  # an mp.spawn entry: fn(rank, *args) in the ranks, no group up
    prefix: str = ""  # the store prefix its own init_process_group joins (spawn=True)
    reference: bool = False  # the reference: also measure the floor
    count: bool = True  # count the loop's collectives per step (a structure golden reads them)


@dataclass
class SideResult:
    """What one side sends back: its record, and for the reference the companions' distances."""

    side: SideLog
    notes: List[str] = field(default_factory=list)  # what the spawn redirect changed
    shadow: List[Gaps] = field(default_factory=list)  # per step; empty where no float64 run counted
    twin: List[Gaps] = field(default_factory=list)  # per step; empty where no twin ran
    floor_notes: List[str] = field(default_factory=list)  # why no shadow; what measured the floor
    structure: Optional[List[Any]] = None  # a rank's StepStructure per piece (counted.py); None: not counted


class NoShadow(BaseException):
    """The float64 run cannot measure the floor (a parameter kept another dtype): stop it early."""


def run_loop(job: LoopJob) -> SideResult:
    """Runs in each rank, or in the reference's process."""
    from ..._context import rank_context

    ctx = rank_context()
    fn = job.fn.load()
    counted = LoopStructure(job.steps) if job.count and not job.reference else None
    with ieee_float32():
        side, notes = run_side(job, fn, ctx.rank, structure=counted)
        result = SideResult(side, notes, structure=counted.result() if counted is not None else None)
        if job.reference:
            add_companions(result, job, fn, ctx.seed)
    return result


def run_side(job: LoopJob, fn, rank: int, tag: str = "", mode=None,
             on_first: Optional[Callable[[SideLog], None]] = None,
             recorder: Optional[Callable[[Watch], StepRecorder]] = None,
             watched: bool = True, structure: Optional[LoopStructure] = None,
             light: bool = False, follow: Sequence[bool] = ()) -> Tuple[SideLog, List[str]]:
    """The user's loop once, recorded (under the dispatch ``mode`` of a companion, if any;
    ``record="optimizer"`` by ``recorder(watch)`` where given; ``watched=False``: no model, input or
    loss hooks, for a recorder that only counts steps; ``light=True``: a companion's run, each step's
    loss, gradients, parameters and learning rates only; its collectives per step into ``structure``;
    ``follow``: per GradScaler.step call, whether the reference skipped it, for a companion to skip too)."""
    lead = (rank,) if job.spawn and not job.reference else ()

    def counting(side: SideLog):
        return structure.counting(side) if structure is not None else contextlib.nullcontext()

    def loop() -> SideLog:
        watch, norms = Watch(light, follow), BatchNormRows()
        with (watch.installed() if watched else contextlib.nullcontext()), \
                (norms.installed() if watched and not light else contextlib.nullcontext()), \
                (mode if mode is not None else contextlib.nullcontext()):
            if job.record == "optimizer":
                steps = recorder(watch) if recorder else StepRecorder(job.steps, watch, on_first)
                with steps.installed(), counting(steps.side):  # the counter's hooks after the recorder's
                    try:
                        fn(*lead, *job.args, **job.kwargs)
                    except StopTraining:
                        pass
                side = steps.side
            else:
                log = Recorder(watch, on_first)
                with counting(log.side):
                    fn(*lead, log, *job.args, steps=job.steps, **job.kwargs)
                side = log.side
        side.set_epoch_calls = watch.set_epoch_calls
        side.scaler_found, side.scalers_made, side.scaled_clips = list(watch.scaler_found), watch.scalers_made, \
            watch.scaled_clips
        side.recomputed = watch.recomputed
        side.batchnorm_rows = norms.most
        side.recurrent = recurrent(watch.model_roots())
        side.sampler_passes = watch.sampler_passes
        side.autocast = side.autocast or watch.autocast
        return side

    if not job.spawn:
        return loop(), []
    from ...spawn_mode import without_group

    out = without_group(job.prefix + tag, loop)
    return out.value, out.notes


def recurrent(models) -> str:
    """"time-major" or "batch-first" where one of ``models`` holds a recurrent layer (its hidden state may
    be carried from step to step); "" otherwise."""
    import torch

    rnns = [m for model in models for m in model.modules() if isinstance(m, torch.nn.RNNBase)]
    return "" if not rnns else "batch-first" if all(m.batch_first for m in rnns) else "time-major"


def add_companions(result: SideResult, job: LoopJob, fn, seed: int) -> None:
    """The float64 shadow where it can run; the same-precision twin where it cannot, and beside it
    where the reference computes in a low precision (autocast, bfloat16 parameters or loss): the
    float64 run measures the reference's distance from exact arithmetic, the twin the distance
    between two runs in that precision, and the line takes the larger. Measured on the minGPT-like
    trainer in bf16 autocast, W=4, 100 AdamW steps: with the float64 run alone a correct run came
    to 0.37 of the line (Adam's first step flips the sign of near-zero bias gradients, which bf16
    rounding moves and float64 does not); with the twin, 0.06."""
    shadow, why = run_shadow(job, fn, seed, light=True, follow=result.side.scaler_found)
    if shadow is not None:
        why = same_start(result.side, shadow)
    if shadow is not None and not why:
        result.shadow = step_gaps(result.side, shadow)
    else:
        result.floor_notes.append(f"no float64 run: {why}")
    side = result.side
    low = any(d in LOW for d in (side.autocast, side.dtype, side.loss_dtype))
    if result.shadow and not low and os.environ.get(COMPANIONS_ENV) != "both":
        return
    try:
        twin = run_twin(job, fn, seed, result.side.scaler_found)
    except Exception as exc:  # noqa: BLE001 - no twin, say why
        result.floor_notes.append(f"no same-precision twin either ({type(exc).__name__}: {exc})")
        return
    elsewhere = same_start(result.side, twin)  # a twin from other weights measures another network
    if elsewhere:
        result.floor_notes.append("no same-precision twin either: " + elsewhere.replace("float64 run", "twin"))
        return
    result.twin = step_gaps(result.side, twin)
    if not result.shadow or low:
        result.floor_notes.append(
            f"the floor was measured in the loop's own precision ({side.autocast or side.dtype}) by a twin of the "
            "reference that sums every matrix product as two halves" + (", beside the float64 run" if result.shadow else ""))


def run_twin(job: LoopJob, fn, seed: int, follow: Sequence[bool] = ()) -> SideLog:
    """The same-precision twin from the test's seed: as ``split_products`` (only the matrix products'
    kernels replaced), or, where the loop convolves, as the ``split_sums`` dispatch mode, run again."""
    from ...launch.rank import seed_everything

    convolved: List[str] = []
    seed_everything(seed)
    try:
        twin, _ = run_side(job, fn, 0, "twin/", split_products(convolved), light=True, follow=follow)
    except Exception:
        if not convolved:
            raise
    if convolved:  # raised in the loop's first convolution, whatever the loop did with it
        seed_everything(seed)
        twin, _ = run_side(job, fn, 0, "twin/", split_sums(), light=True, follow=follow)
    return twin


def run_shadow(job: LoopJob, fn, seed: int, rank: int = 0, light: bool = False,
               follow: Sequence[bool] = ()) -> Tuple[Optional[SideLog], str]:
    """The reference loop (or, in a rank, the user's loop) again with float64 as the default dtype,
    from the same seed and the same random draws (``float64_kernels``); (None, why) where it cannot
    run or keeps another dtype, ``why`` naming the lines that asked for another dtype (found by
    ``find_pins``, only then)."""
    side, why = _float64_run(job, fn, seed, rank, "shadow/", float64_kernels(), light, follow)
    if why:
        pins: List[str] = []
        _float64_run(job, fn, seed, rank, "pins/", float64_dispatch(pins, stop=True), light, follow)
        return None, why + (f"; that dtype was asked for at {'; '.join(pins)}" if pins else "")
    if side is None or not side.steps:
        return None, "the float64 run took no step"
    return side, ""


def _float64_run(job: LoopJob, fn, seed: int, rank: int, tag: str, companion,
                 light: bool = False, follow: Sequence[bool] = ()) -> Tuple[Optional[SideLog], str]:
    """One float64 run under ``companion`` (the kernels, or the pin-finding mode); why it failed."""
    import torch

    from ...launch.rank import seed_everything

    def check(side: SideLog) -> None:
        narrow = [(n, t.dtype) for n, t in side.steps[0].params.items() if t is not None and t.dtype != torch.float64]
        if narrow:
            name, dtype = narrow[0]
            raise NoShadow(f"parameter {name} stayed {str(dtype).replace('torch.', '')} with float64 as the "
                           f"default dtype ({len(narrow)} of {len(side.steps[0].params)} parameters)")

    saved = torch.get_default_dtype()
    seed_everything(seed)
    torch.set_default_dtype(torch.float64)
    try:
        side, _ = run_side(job, fn, rank, tag, companion, check, light=light, follow=follow)
    except NoShadow as exc:
        return None, str(exc)
    except PinsFound:
        return None, ""
    except Exception as exc:  # noqa: BLE001 - a loop that cannot run in float64: say why
        return None, f"the loop raised {type(exc).__name__} in float64 ({str(exc)[:200]})"
    finally:
        torch.set_default_dtype(saved)
    return side, ""


def same_start(ref: SideLog, shadow: SideLog) -> str:
    """Why the float64 run cannot measure the floor ("" when it can): it must start where the
    reference started."""
    if not ref.steps:
        return ""
    want, wide = ref.steps[0].params, shadow.steps[0].params
    for name, t in want.items():
        w = wide.get(name)
        if t is None or w is None or t.shape != w.shape:
            return f"the reference loop's float64 run has no parameter {name!r} of shape {tuple(t.shape)}"
        rel = gap(t, w) / max(float(t.double().norm()), 1e-12)
        if rel > SAME_START:
            return (f"the reference loop's float64 run started from other weights ({name} differs by "
                    f"{rel:.2g} relative at step 0): its model or data do not come from the test's seed alone")
    return ""


def step_gaps(ref: SideLog, other: SideLog) -> List[Gaps]:
    """||reference - companion|| per step, for the loss and every gradient and parameter."""
    out = []
    for want, got in zip(ref.steps, other.steps):
        gaps: Gaps = {("loss", "loss"): abs(want.loss - got.loss) if math.isfinite(got.loss) else math.nan}
        for kind, mine, theirs in (("grad", want.grads, got.grads), ("param", want.params, got.params)):
            for name, t in mine.items():
                gaps[(kind, name)] = gap(t, theirs.get(name))
        out.append(gaps)
    return out
