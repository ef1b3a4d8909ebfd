"""``dist.assert_same_training``: the user's own distributed training loop against their own
one-device loop, step by step, with the same table, tolerance and hints as ``assert_parity``.

The user's loop runs in every rank (their DDP, FSDP, samplers, hand-written all_reduce) and the
reference loop in one process; both call ``log(model, loss)`` once per step (``recorder.py``). The
test process then compares, per step:
- the mean of the ranks' losses with the reference's loss (each rank logs its shard's mean loss);
- rank 0's gradients and parameters with the reference's;
- every other rank's gradients and parameters with rank 0's (replicas that should be equal), as
  rows named ``rank r: <name>``.
The reference loop is also run in float64 (default dtype) where it can be, and the float32/float64
distance fills each tensor's ``floor`` (the model's own roundoff) for the tolerance.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

from .engine import ParityError, ParityReport, judge
from .hints import UserFacts, replica_name
from .recorder import SideLog, record, record_shadow
from .distance import compare, gap, tensor_error
from .records import Portable, RankResult, StepRecord, TensorError


class StepCountError(AssertionError):
    """A side logged a different number of steps than asked for."""


@dataclass(frozen=True)
class LoopJob:
    """One side's loop, as the ranks (or the one reference process) receive it."""

    fn: Portable
    args: tuple
    kwargs: Dict[str, Any]
    steps: int
    shadow: bool = False  # the reference: also run it in float64


def run_loop(job: LoopJob) -> Tuple[SideLog, Optional[SideLog]]:
    """Runs in each rank, or in the reference's process: the loop, and its float64 shadow."""
    from .._context import rank_context

    fn = job.fn.load()
    side = record(fn, job.args, job.kwargs, job.steps)
    shadow = record_shadow(fn, job.args, job.kwargs, job.steps, rank_context().seed) if job.shadow else None
    return side, shadow


def assert_same_training(dist, fn, reference_fn, *args, steps: int = 3, rtol: Optional[float] = None,
                         atol: Optional[float] = None, timeout: Optional[float] = None,
                         **kwargs) -> ParityReport:
    """``fn(log, *args, steps=steps, **kwargs)`` in every rank against ``reference_fn(log, ...)`` in
    one process; raises ParityError where they train differently, returns the ParityReport."""
    __tracebackhide__ = True
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive integer, got {steps!r}")
    job = LoopJob(Portable.of(fn, "fn"), args, kwargs, steps)
    ranks = dist.run(run_loop, job, timeout=timeout)
    ref, shadow = dist.run_single(run_loop, LoopJob(Portable.of(reference_fn, "reference_fn"), args,
                                                    kwargs, steps, shadow=True), timeout=timeout)
    _check_counts([("reference_fn (one process)", ref)] +
                  [(f"fn on rank {r}", side) for r, (side, _) in enumerate(ranks)], steps)
    mismatch = shadow_mismatch(ref, shadow)
    if mismatch:
        shadow = None
    result = compare_sides([side for side, _ in ranks], ref, shadow, name=getattr(fn, "__name__", "fn"))
    plan = getattr(dist, "plan", None)
    where = plan.describe() if plan is not None else f"{dist.world_size} x {dist.device_type}"
    report = judge(result, result.facts.strategy, dist.world_size, where, rtol, atol, False)
    if mismatch:
        report.notes.append(f"no roundoff floor measured: {mismatch}")
    elif shadow is None:
        report.notes.append("the reference loop could not run in float64: no roundoff floor measured")
    if not report.passed:
        raise ParityError(report.failure_message(), report)
    return report


def _check_counts(sides: List[Tuple[str, SideLog]], steps: int) -> None:
    wrong = [f"{who} logged {len(side.steps)}" for who, side in sides if len(side.steps) != steps]
    if wrong:
        raise StepCountError(
            f"assert_same_training(steps={steps}): {'; '.join(wrong)} step(s). Each loop must call "
            "log(model, loss) once per step, after backward and before optimizer.step(), for exactly "
            "`steps` steps (it receives steps= as a keyword).")


# The float64 run starts from the float32 run's weights (the same random draws, widened), so its
# step-0 parameters differ by the rounding of the init arithmetic alone (~1e-7 relative). A larger
# gap means the loop built its model from something the shadow did not reproduce (a clock, a file,
# os.urandom): then its distance is not roundoff, and judging by it would forgive any bug.
SAME_START = 1e-4


def shadow_mismatch(ref: SideLog, shadow: Optional[SideLog]) -> str:
    """Why the float64 run cannot measure the floor ("" when it can): it must start where the
    reference started."""
    if shadow is None or not ref.steps or not shadow.steps:
        return ""
    want, wide = ref.steps[0].params, shadow.steps[0].params
    for name, t in want.items():
        w = wide.get(name)
        if t is None or w is None or t.shape != w.shape:
            return f"the reference loop's float64 run has no parameter {name!r} of shape {tuple(t.shape)}"
        rel = gap(t, w) / max(float(t.double().norm()), 1e-12)
        if rel > SAME_START:
            return (f"the reference loop's float64 run started from other weights ({name} differs by "
                    f"{rel:.2g} relative at step 0): its model or data do not "
                    "come from the test's seed alone")
    return ""


def compare_sides(ranks: List[SideLog], ref: SideLog, shadow: Optional[SideLog], name: str) -> RankResult:
    """Per-step errors: ranks' mean loss and rank 0 against the reference, ranks against rank 0."""
    import torch

    world = len(ranks)
    facts = UserFacts(strategy=f"{name} (your training loop)", world_size=world, microbatches=world,
                      dropout=list(ref.dropout), rank_batchnorm=list(ranks[0].batchnorm),
                      exact_note="the ranks sum gradients over shards in another order than one device")
    records = []
    for step, want in enumerate(ref.steps):
        logs = [side.steps[step] for side in ranks]
        wide = shadow.steps[step] if shadow is not None else None
        facts.rank_losses.append([s.loss for s in logs])
        loss = torch.tensor(sum(s.loss for s in logs) / world, dtype=torch.float64)
        rec = StepRecord(step, [tensor_error("loss", "loss", loss, torch.tensor(want.loss, dtype=torch.float64))])
        if wide is not None:
            rec.errors[0].floor = abs(want.loss - wide.loss)
        for kind, got, ref_t, wide_t in (("grad", logs[0].grads, want.grads, wide and wide.grads),
                                         ("param", logs[0].params, want.params, wide and wide.params)):
            errors = compare(kind, got, ref_t)
            floors = _floors(kind, ref_t, wide_t, errors)
            rec.errors += errors
            for r in range(1, world):
                other = getattr(logs[r], kind + "s")
                for e in compare(kind, other, got):
                    e.floor, e.name = floors.get(e.name, e.floor), replica_name(r, e.name)
                    rec.errors.append(e)
        records.append(rec)
    return RankResult(records, facts)


def _floors(kind: str, ref: Dict, wide: Optional[Dict], errors: List[TensorError]) -> Dict[str, float]:
    """Fill each error's floor with ||reference - float64 shadow||; return them by name."""
    out = {}
    if wide is None:
        return out
    for e in errors:
        e.floor = out[e.name] = gap(ref.get(e.name), wide.get(e.name))
    return out
