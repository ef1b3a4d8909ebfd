"""``assert_parity``: train a model with a strategy on N devices and on one device, compare loss,
gradients, parameters (and buffers, outputs where the strategy sees the global batch) after every
step, and fail with a table of where it first diverges and why that usually happens.

The ranks measure (``worker.py``); this module judges, in the test process, against a tolerance
derived from the dtype and from whether the strategy reorders reductions (see ``derive_tolerance``).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, List, Optional, Tuple

from ..launch.errors import RankFailure
from . import strategies
from .diagnose import failure_message, summary_table
from .records import KINDS, ParityJob, Portable, RunFacts, StepRecord, TensorError

# Unit roundoff of each dtype (torch.finfo(dtype).eps); "tf32" is fp32 on TF32 tensor cores.
EPS = {"float64": 2.22e-16, "float32": 1.19e-7, "tf32": 9.77e-4, "bfloat16": 7.81e-3, "float16": 9.77e-4}
# atol only matters for tensors whose reference is ~0 (unused or dead parameters).
ATOL_FACTOR = 1e-3


class ParityError(AssertionError):
    """The strategy diverged from one device; ``.report`` holds every measured error."""

    def __init__(self, message: str, report: "ParityReport"):
        super().__init__(message)
        self.report = report


@dataclass(frozen=True)
class Tolerance:
    """A tensor passes when ||strategy - reference|| <= atol * sqrt(numel) + rtol * ||reference||.

    Norm-wise, because elementwise errors mislead both ways: near-zero entries show huge relative
    errors from roundoff (DDP's fp32 grads: 1e-4 relative there, 1e-8 absolute), and a ReLU whose
    input sits at 0 flips with roundoff and moves a few elements by far more than the rest (ResNet18
    under DDP x4, step 3: max error 1.5e-4 of the tensor's max, norm-wise 3.5e-5). The table shows
    both; the norm-wise one is judged."""

    rtol: float
    atol: float
    source: str

    def bound(self, e: TensorError) -> float:
        """The largest ||strategy - reference|| this tensor may have."""
        return self.atol * math.sqrt(max(1, e.numel)) + self.rtol * e.norm_ref

    def passes(self, e: TensorError) -> bool:
        if self.rtol == 0 and self.atol == 0:
            return e.max_abs == 0
        return math.isfinite(e.norm_err) and e.norm_err <= self.bound(e)

    def describe(self) -> str:
        if self.rtol == 0 and self.atol == 0:
            return f"bitwise ({self.source})"
        return f"rtol={self.rtol:.3g}, atol={self.atol:.3g} ({self.source})"


def derive_tolerance(facts: RunFacts, steps: int) -> Tolerance:
    """rtol = sqrt(eps(dtype)) * sqrt(partial sums reordered).

    sqrt(eps): half the significant digits survive a few training steps of a deep network, where
    normalization amplifies roundoff and ReLU kinks flip (measured fp32 worst, norm-wise: 3.5e-5 on
    ResNet18-GN under DDP x4; 1e-6 typical; sqrt(eps) = 3.5e-4). sqrt(partial sums): a strategy that
    splits a sum over W shards or M micro-batches adds roundoff that grows like its square root; one
    that computes in the reference's order (model parallel, one rank) gets 1. Real bugs are far
    above: BatchNorm on shards 0.1 to 1, a 'sum' loss under averaging 1 - 1/W, a padded shard ~0.1.
    """
    eps = EPS.get(facts.dtype, EPS["float32"])
    base = facts.strategy.split("/")[0]
    parts = facts.world_size if base in ("ddp", "fsdp", "dp") else 1
    parts *= max(1, facts.microbatches)
    parts = 1 if facts.exact else max(1, parts)
    rtol = math.sqrt(eps) * math.sqrt(parts)
    why = f"derived: sqrt({facts.dtype} eps {eps:.3g})"
    if parts > 1:
        why += f" x sqrt({parts} partial sums)"
    return Tolerance(rtol, rtol * ATOL_FACTOR, why)


@dataclass
class ParityReport:
    """Every measured error of a parity run, and the judgement. ``format()`` is the per-step table."""

    strategy: str
    world_size: int
    where: str  # e.g. "2 x cpu (gloo, emulated)"
    tolerance: Tolerance
    records: List[StepRecord]
    facts: RunFacts
    notes: List[str] = field(default_factory=list)

    def describe(self) -> str:
        return f"{self.facts.strategy} on {self.where}"

    def failures(self) -> List[Tuple[int, TensorError, float]]:
        """(step, error, bound on ||strategy - reference||) of every tensor over tolerance."""
        return [(rec.step, e, self.tolerance.bound(e)) for rec in self.records for e in rec.errors
                if not self.tolerance.passes(e)]

    @property
    def passed(self) -> bool:
        return not self.failures()

    @property
    def first_divergence(self) -> Optional[int]:
        f = self.failures()
        return f[0][0] if f else None

    def errors(self, kind: Optional[str] = None, step: Optional[int] = None) -> List[TensorError]:
        if kind is not None and kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        return [e for r in self.records if step is None or r.step == step
                for e in r.errors if kind is None or e.kind == kind]

    def max_abs(self, kind: Optional[str] = None, step: Optional[int] = None) -> float:
        return max((e.max_abs for e in self.errors(kind, step)), default=0.0)

    def max_rel(self, kind: Optional[str] = None, step: Optional[int] = None) -> float:
        """Worst elementwise error relative to the tensor's max |reference|."""
        return max((e.max_rel for e in self.errors(kind, step)), default=0.0)

    def rel(self, kind: Optional[str] = None, step: Optional[int] = None) -> float:
        """Worst norm-wise relative error ||strategy - reference|| / ||reference|| (what is judged)."""
        return max((e.rel for e in self.errors(kind, step)), default=0.0)

    def per_step(self, metric: str = "rel") -> List[dict]:
        """The worst error of each kind, per step: ``metric`` is "rel" (norm-wise, judged),
        "max_rel" or "max_abs". What a test prints or asserts on."""
        get = {"rel": self.rel, "max_rel": self.max_rel, "max_abs": self.max_abs}.get(metric)
        if get is None:
            raise ValueError(f"metric must be 'rel', 'max_rel' or 'max_abs', got {metric!r}")
        return [{"step": r.step, **{k: get(k, r.step) for k in KINDS if self.errors(k, r.step)}}
                for r in self.records]

    @property
    def exact(self) -> bool:
        """Bitwise equality was demanded."""
        return self.tolerance.rtol == 0 and self.tolerance.atol == 0

    @property
    def bitwise(self) -> bool:
        return all(e.max_abs == 0 for e in self.errors())

    def format(self) -> str:
        verdict = "matches" if self.passed else "DIVERGES from"
        head = (f"parity: {self.describe()} {verdict} one device over {len(self.records)} step(s); "
                f"{'bitwise equal' if self.bitwise else 'tolerance ' + self.tolerance.describe()}")
        body = [head, summary_table(self)]
        body += [f"note: {n}" for n in self.notes]
        return "\n".join(body)

    def failure_message(self) -> str:
        return failure_message(self)


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
    spec, opts = strategies.resolve(strategy, options)
    if not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be a positive integer, got {steps!r}")
    for name, v in (("rtol", rtol), ("atol", atol)):
        if v is not None and not (isinstance(v, (int, float)) and v >= 0):
            raise ValueError(f"{name} must be a non-negative number, got {v!r}")
    reason = strategies.unavailable(spec, opts, dist.device_type, dist.world_size)
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
    )
    from .worker import run_parity

    try:
        if spec.process == "single":
            result = dist.run_single(run_parity, job, timeout=timeout)
        else:
            result = dist.run(run_parity, job, timeout=timeout)[0]
    except RankFailure as failure:
        text = failure.format()
        if "find_unused_parameters" in text or "did not receive grad" in text:
            failure.hint = (failure.hint + "\n" if failure.hint else "") + (
                "Parity hint: the model has parameters that get no gradient; pass "
                "find_unused_parameters=True to assert_parity('ddp', ...) or remove them.")
        raise
    report = judge(result, spec.name, dist.world_size, _where(dist), rtol, atol, deterministic)
    if not report.passed:
        raise ParityError(report.failure_message(), report)
    return report


def _where(dist) -> str:
    plan = getattr(dist, "plan", None)
    return plan.describe() if plan is not None else f"{dist.world_size} x {dist.device_type}"


def judge(result, strategy: str, world_size: int, where: str, rtol, atol, deterministic: bool) -> ParityReport:
    """The report for a rank's result under the requested (or derived) tolerance."""
    facts = result.facts
    derived = derive_tolerance(facts, len(result.records))
    notes = []
    if rtol is not None or atol is not None:
        tol = Tolerance(derived.rtol if rtol is None else float(rtol),
                        derived.atol if atol is None else float(atol), "given")
        if deterministic:
            notes.append("deterministic=True with an explicit rtol/atol: the tolerance wins")
    elif deterministic and facts.exact:
        tol = Tolerance(0.0, 0.0, f"deterministic=True: {facts.exact_note}")
    else:
        tol = derived
        if deterministic:
            notes.append(f"deterministic=True, but bitwise equality is not possible: {facts.exact_note}; "
                         "judged with the derived tolerance")
    return ParityReport(strategy, world_size, where, tol, result.records, facts, notes)
