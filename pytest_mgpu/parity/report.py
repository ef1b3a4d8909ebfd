"""The outcome of a parity run: every measured error, the tolerance that judged it, and the words.

``ParityReport`` keeps the bookkeeping (which tensors fail, how far along the line each step is);
``diagnose`` renders it (tables, likely causes), as torch.utils.benchmark's ``Compare`` keeps its
bookkeeping apart from rendering.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import List, Literal, Optional, Tuple

from . import message
from .records import KINDS, Kind, RunFacts, StepRecord, TensorError
from .judge.options import OptionDifference
from .judge.tolerance import Tolerance

# A gradient line wider than this (1% of a gradient's norm; bfloat16's roundoff makes lines of 5-20%) is
# said in a pass: a bug that moves the gradients by less passes unseen there.
BLIND = 0.01

# How per_step measures a kind's worst error: norm-wise relative (judged), elementwise relative, absolute.
Metric = Literal["rel", "max_rel", "max_abs"]


@dataclass(frozen=True)
class StepLine:
    """One step against the line: the pooled float64 floor, the worst error, how far along it is."""

    step: int
    floor: Optional[float]  # the measured relative floor of the worst tensor's kind (None: not measured)
    line: float  # the relative line of the worst tensor's kind at this step
    worst: Optional[TensorError]  # the tensor closest to (or furthest past) its line
    ratio: float  # worst error / its bound: <= 1 passes


class ParityError(AssertionError):
    """The strategy diverged from one device; ``.report`` holds every measured error."""

    def __init__(self, message: str, report: "ParityReport"):
        super().__init__(message)
        self.report = report


@dataclass
class ParityReport:
    """Every measured error of a parity run, and the judgement, as ``dist.assert_parity``,
    ``assert_same_training`` and ``assert_resumes`` return it (and ``ParityError.report`` holds it).
    ``print(report.format())`` shows the per-step table.

    Attributes:
        strategy: What was judged: the strategy's name, "user" or the loop's function name.
        world_size: The test's world size.
        where: The devices it ran on, e.g. "2 x cpu (gloo, emulated)".
        tolerance: The rule and the measured line every tensor was judged by.
        records: Per step, the error of every compared tensor.
        facts: What the run knew of the model and its sides (for the hints).
        notes: What the reader should know: where a resume started, why a check was skipped.
        against: What the run was compared with, e.g. "one device".
        keywords: The keywords each side received, where the test passed any (``assert_same_training``).
        option_differences: The optimizer options (lr, weight decay, betas ...) that differ from the
            reference's, each at the first step it does (``assert_same_training``): each fails the check.
    """

    strategy: str
    world_size: int
    where: str  # e.g. "2 x cpu (gloo, emulated)"
    tolerance: Tolerance
    records: List[StepRecord]
    facts: RunFacts
    notes: List[str] = field(default_factory=list)
    against: str = "one device"  # what the run was compared with
    keywords: str = ""  # the keywords each side received, where the test passed any (assert_same_training)
    option_differences: List[OptionDifference] = field(default_factory=list)  # judge.options

    def describe(self, keywords: bool = True) -> str:
        """The strategy and its devices, e.g. "ddp on 2 x cpu (gloo, emulated)", and the keywords each
        side received where the test passed any (``keywords=False``: without them)."""
        said = keywords and self.keywords
        return f"{self.facts.strategy} on {self.where}" + (f" ({self.keywords})" if said else "")

    def failures(self) -> List[Tuple[int, TensorError, float]]:
        """(step, error, bound on ||strategy - reference||) of every tensor over tolerance."""
        return [(rec.step, e, self.tolerance.bound(e, rec.step)) for rec in self.records for e in rec.errors
                if not self.tolerance.passes(e, rec.step)]

    @property
    def passed(self) -> bool:
        """No tensor exceeded its bound at any step, and no optimizer option differs."""
        return not self.failures() and not self.option_differences

    @property
    def first_divergence(self) -> Optional[int]:
        """The first step with a tensor over its bound or an optimizer option that differs; None when it passed."""
        f = self.failures()
        steps = ([f[0][0]] if f else []) + [d.step for d in self.option_differences]
        return min(steps) if steps else None

    def lines(self) -> List[StepLine]:
        """Per step: the floor, the worst tensor relative to its line, and the ratio."""
        out = []
        for rec in self.records:
            ratios = [(self.tolerance.ratio(e, rec.step), e) for e in rec.errors]
            ratio, worst = max(ratios, key=lambda r: r[0], default=(0.0, None))
            kind = worst.kind if worst is not None and ratio > 0 else "grad"
            out.append(StepLine(rec.step, self.tolerance.floors.get((rec.step, kind)),
                                self.tolerance.rel_line(rec.step, kind), worst, ratio))
        return out

    def blind_below(self) -> Optional[Tuple[int, float]]:
        """(step, line) of the widest gradient line where it is over ``BLIND`` of a gradient's norm: a
        difference under it passes unseen there, so a pass says "cannot tell" below it (None: none is)."""
        widest = max(((self.tolerance.rel_line(r.step, "grad"), r.step) for r in self.records
                      if any(e.kind == "grad" for e in r.errors)), default=None)
        return (widest[1], widest[0]) if widest is not None and widest[0] > BLIND else None

    @property
    def worst_ratio(self) -> float:
        """The largest error / bound over every step and tensor: how close the run came to failing."""
        return max((line.ratio for line in self.lines()), default=0.0)

    def errors(self, kind: Optional[Kind] = None, step: Optional[int] = None) -> List[TensorError]:
        """Every compared tensor's error, of one kind ("loss", "output", "grad", "param", "buffer")
        and one step where given."""
        if kind is not None and kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        return [e for r in self.records if step is None or r.step == step
                for e in r.errors if kind is None or e.kind == kind]

    def max_abs(self, kind: Optional[Kind] = None, step: Optional[int] = None) -> float:
        """Worst elementwise absolute error."""
        return max((e.max_abs for e in self.errors(kind, step)), default=0.0)

    def max_rel(self, kind: Optional[Kind] = None, step: Optional[int] = None) -> float:
        """Worst elementwise error relative to the tensor's max |reference|."""
        return max((e.max_rel for e in self.errors(kind, step)), default=0.0)

    def rel(self, kind: Optional[Kind] = None, step: Optional[int] = None) -> float:
        """Worst norm-wise relative error ||strategy - reference|| / ||reference|| (what is judged)."""
        return max((e.rel for e in self.errors(kind, step)), default=0.0)

    def per_step(self, metric: Metric = "rel") -> List[dict]:
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
        return self.tolerance.rule == "bitwise" or (self.tolerance.rtol == 0 and self.tolerance.atol == 0)

    @property
    def bitwise(self) -> bool:
        """Every compared tensor was bitwise equal to the reference."""
        return all(e.max_abs == 0 for e in self.errors())

    def __str__(self) -> str:
        return self.format()

    def format(self) -> str:
        """The verdict, the per-step table (worst error of each kind, floor, line, worst / line) and
        the notes."""
        verdict = "matches" if self.passed else "DIVERGES from"
        judged = "bitwise equal" if self.bitwise else "tolerance " + self.tolerance.describe()
        head = f"parity: {self.describe()} {verdict} {self.against} over {len(self.records)} step(s); {judged}"
        worst = self.worst_ratio
        if not self.bitwise and math.isfinite(worst):
            head += f"; worst error / line: {worst:.3g}"
        blind = self.blind_below() if self.passed and not self.bitwise else None
        if blind is not None:
            why = "from the roundoff of the loop's precision" if self.tolerance.rule == "measured" else "the rtol given"
            head += (f"; cannot tell a difference under {blind[1]:.2g} of a gradient's norm (the line at step "
                     f"{blind[0]}, {why}): a pass rules out larger ones only")
        body = [head, message.summary_table(self)]
        body += [f"note: {n}" for n in self.notes]
        return "\n".join(body)

    def failure_message(self) -> str:
        """What ``ParityError`` says: the cause and fix first, then the table and every hint."""
        return message.failure_message(self)
