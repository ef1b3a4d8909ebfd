"""``assert_parity``: train a model with a strategy on N devices and on one device, compare loss,
gradients, parameters (and buffers, outputs where the strategy sees the global batch) after every
step, and fail with a table of where it first diverges and why that usually happens.

The ranks measure (``worker.py``: the strategy, the float32 reference and its float64 shadow);
this module judges, in the test process, against the line measured from the shadow, or derived
from the dtype where no shadow could run (``tolerance.py``).
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any, Optional

from ..launch.errors import RankFailure
from . import registry
from .records import ParityJob, Portable
from .report import ParityError, ParityReport
from .judge.tolerance import Tolerance, derive_tolerance, measure_tolerance


def sgd_momentum(params):
    """The default optimizer: SGD with momentum. Not Adam, which normalizes gradient scale away and
    so hides the errors (a factor of world size, a missing average) that parity is meant to find."""
    import torch

    return torch.optim.SGD(params, lr=0.05, momentum=0.9)


def cross_entropy(outputs, targets):
    """The default loss: mean cross entropy (what DDP's gradient averaging assumes)."""
    import torch.nn.functional as F

    return F.cross_entropy(outputs, targets)


def _skip(reason: str):
    __tracebackhide__ = True  # pytest reports a skip where its last visible frame is: the test
    import pytest  # the outcome, not the hook machinery: a strategy this hardware cannot run skips

    pytest.skip(f"parity {reason}")


def assert_parity(dist, strategy: str, model_fn, batch_fn, *, loss_fn=None, optimizer_fn=None,
                  steps: int = 3, rtol: Optional[float] = None, atol: Optional[float] = None,
                  deterministic: bool = False, timeout: Optional[float] = None,
                  **options: Any) -> ParityReport:
    """Train ``model_fn()`` with ``strategy`` on ``dist.world_size`` devices and on one device, on
    the global batches ``batch_fn(step) -> (inputs, targets)``, and compare after every step.

    Strategies (``pytest_mgpu.parity.STRATEGIES``): "ddp", "fsdp" (fsdp_version=2|1), "dp",
    "model_parallel" (split_points=[...]), "pipeline" (split_size=..., or schedule="gpipe"|"1f1b"
    across ranks). Raises ParityError (an AssertionError) with the divergence table and likely
    causes; skips where the hardware cannot run the strategy; returns the ParityReport.
    ``deterministic=True`` demands bitwise equality where the strategy computes in the reference's
    order (the report says when it cannot, and falls back to the tolerance).
    """
    __tracebackhide__ = True
    spec, opts = registry.resolve(strategy, options)
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive integer, got {steps!r}")
    for name, v in (("rtol", rtol), ("atol", atol)):
        if v is not None and not (isinstance(v, (int, float)) and v >= 0):
            raise ValueError(f"{name} must be a non-negative number, got {v!r}")
    reason = registry.unavailable(spec, opts, dist.device_type, dist.world_size,
                                  shared=bool(getattr(getattr(dist, "plan", None), "shared_gpus", 0)))
    if reason:
        _skip(f"{strategy!r} cannot run here: {reason}")
    job = ParityJob(
        strategy=strategy,
        model_fn=Portable.of(model_fn, "model_fn"),
        batch_fn=Portable.of(batch_fn, "batch_fn"),
        loss_fn=Portable.of(loss_fn or cross_entropy, "loss_fn"),
        optimizer_fn=Portable.of(optimizer_fn or sgd_momentum, "optimizer_fn"),
        steps=steps,
        deterministic=deterministic,
        world_size=dist.world_size,
        options=opts,
        shadow=rtol is None and atol is None,
    )
    outputs, nondeterministic = _launch(dist, spec, job, timeout)
    _keep_structure(dist, strategy, outputs)
    report = judge(outputs[0].result, spec.name, dist.world_size, _where(dist), rtol, atol,
                   deterministic and not nondeterministic)
    if nondeterministic:
        report.notes.insert(0, f"deterministic=True, but {nondeterministic} has no deterministic implementation "
                               f"on {dist.device_type}: bitwise equality cannot be demanded; judged by the "
                               f"{report.tolerance.rule} tolerance (the run repeated with deterministic kernels "
                               f"where torch has them)")
    if not report.passed:
        raise ParityError(report.failure_message(), report)
    return report


_NO_DETERMINISTIC = re.compile(r"(\S+) does not have a deterministic implementation")


def _launch(dist, spec, job: ParityJob, timeout):
    """The ranks' outputs, and the op that had no deterministic implementation ("" if none).

    Bitwise mode turns torch's deterministic algorithms on without warn-only (warn-only lets fused
    attention's backward take its non-deterministic branch). An op that has no deterministic
    implementation then raises in a rank; the run is repeated with deterministic kernels only where
    torch has them, and the caller judges it by the measured line, naming that op."""
    from .worker import run_parity

    def launch(job: ParityJob):
        if spec.process == "single":
            return [dist.run_single(run_parity, job, timeout=timeout)]
        return dist.run(run_parity, job, timeout=timeout)

    try:
        return launch(job), ""
    except RankFailure as failure:
        text = failure.format()
        op = _NO_DETERMINISTIC.search(text) if job.deterministic else None
        if op is not None:
            return launch(dataclasses.replace(job, deterministic=False, deterministic_kernels=True)), op.group(1)
        if "find_unused_parameters" in text or "did not receive grad" in text:
            failure.hint = (failure.hint + "\n" if failure.hint else "") + (
                "Parity hint: the model has parameters that get no gradient; pass "
                "find_unused_parameters=True to assert_parity('ddp', ...) or remove them.")
        raise


def _keep_structure(dist, strategy: str, outputs) -> None:
    """The call's collectives per rank and step, for the structure goldens (``timing.structure``)."""
    kept = getattr(dist, "structures", None)
    if kept is None:
        return
    from ..timing.structure.figures import of_parity

    index = sum(1 for s in kept if s.kind == "parity")
    kept.append(of_parity(strategy, index, dist.world_size, {r: out.structure for r, out in enumerate(outputs)},
                          dist.device_type))


def _where(dist) -> str:
    plan = getattr(dist, "plan", None)
    return plan.describe() if plan is not None else f"{dist.world_size} x {dist.device_type}"


def judge(result, strategy: str, world_size: int, where: str, rtol, atol, deterministic: bool) -> ParityReport:
    """The report for a rank's result, judged by (in this order): the user's rtol/atol; bitwise
    equality where deterministic=True and the strategy computes in the reference's order; the line
    measured from the float64 shadow; the derived rule where no shadow could run (the report says
    which rule judged, and why no shadow)."""
    facts = result.facts
    derived = derive_tolerance(facts)
    notes = []
    if rtol is not None or atol is not None:
        tol = Tolerance(derived.rtol if rtol is None else float(rtol),
                        derived.atol if atol is None else float(atol), "given", "given")
        if deterministic:
            notes.append("deterministic=True with an explicit rtol/atol: the tolerance wins")
    elif deterministic and facts.exact:
        tol = Tolerance(0.0, 0.0, f"deterministic=True: {facts.exact_note}", "bitwise")
    else:
        measured, twin_note = measure_tolerance(result.records, facts)
        tol = measured or derived
        if twin_note:
            notes.append(f"the twin was not trusted: {twin_note}")
        if tol.rule == "derived" and facts.shadow_note:
            notes.append(f"judged by the derived rule: {facts.shadow_note}")
        if deterministic:
            notes.append(f"deterministic=True, but bitwise equality is not possible: {facts.exact_note}; "
                         f"judged by the {tol.rule} tolerance")
    return ParityReport(strategy, world_size, where, tol, result.records, facts, notes)
