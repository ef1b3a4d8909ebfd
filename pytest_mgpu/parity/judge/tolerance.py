"""The line a correct strategy stays within: measured from the model's own roundoff where a float64
shadow of the reference ran, derived from the dtype where none could, or given by the user.

The measured rule, per step s and kind k (loss, output, grad, param, buffer):

    floor(s, k) = max over steps <= s, max over tensors t of kind k:  ||ref32_t - ref64_t|| / ||ref_t||
    line_t      = MULTIPLE x sqrt(partial sums reordered) x max(floor(s, k), eps) x ||ref_t||

Why pooled (max over the step's tensors of a kind) and not tensor by tensor: roundoff is amplified
by ReLU/ReLU6 kinks that flip at random, so WHICH tensor carries a step's largest error differs
between two valid float32 computations (in a real DDP run of MobileNetV2-GN the worst tensor was a
144x1x3x3 depthwise conv that was not the worst in the float32/float64 comparison). The step's worst
gap measures how far the model lets roundoff grow at that step; a correct strategy's errors, wherever
they land, stay near it. Why a running max over steps: the amplification does not shrink back
within a few steps, and one shadow's draw of kinks can be luckier at step s than at s-1.
Why sqrt(partial sums): a strategy that splits a sum over W shards or M micro-batches adds
roundoff of its own that grows like its square root (as the derived rule has it).
MULTIPLE is measured: see ``benchmarks/parity/parity_calibration.py`` and the note on it below.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Dict, Iterable, List, Literal, Optional, Tuple

from ..records import RunFacts, StepRecord, TensorError

# Unit roundoff of each dtype (torch.finfo(dtype).eps); "tf32" is fp32 on TF32 tensor cores.
EPS = {"float64": 2.22e-16, "float32": 1.19e-7, "tf32": 9.77e-4, "bfloat16": 7.81e-3, "float16": 9.77e-4}
# atol only matters for tensors whose reference is ~0 (unused or dead parameters).
ATOL_FACTOR = 1e-3
# Replicas (data-parallel copies, tensor-parallel peers' replicated tensors) hold the same bits when correct:
# each reduces to the same result and applies the same update. Their line against each other is at most this,
# relative, whatever the precision the reference's line had to take (an autocast loop's is 10-30%).
REPLICA_LINE = 1e-4
# How far above the float64 gap a correct strategy may land (times sqrt(partial sums)). Measured by
# benchmarks/parity/parity_calibration.py over a zoo of correct configurations (MLP, CNN-GN, ResNet18/50
# GN and eval-BN, MobileNetV2-GN, a Transformer encoder; DDP/FSDP x2/x4, model parallel, pipelines;
# 4 steps; several seeds; torch threads 1 and 2): see docs/design/parity-calibration.md for the figures.
MULTIPLE = 16.0
DATA_PARALLEL = ("ddp", "fsdp", "dp")

Rule = Literal["measured", "derived", "given", "bitwise"]


def partial_sums(facts: RunFacts) -> int:
    """How many partial sums the strategy adds up in another order than one device does."""
    if facts.exact:
        return 1
    base = facts.strategy.split("/")[0]
    parts = facts.world_size if base in DATA_PARALLEL else 1
    return max(1, parts * max(1, facts.microbatches))


@dataclass(frozen=True)
class Tolerance:
    """A tensor passes when ||strategy - reference|| <= atol * sqrt(numel) + rtol * ||reference||,
    with rtol (and atol) per step and kind under the measured rule.

    Norm-wise, because elementwise errors mislead both ways: near-zero entries show huge relative
    errors from roundoff (DDP's fp32 grads: 1e-4 relative there, 1e-8 absolute), and a flipped ReLU
    moves a few elements by far more than the rest. The table shows both; the norm-wise one is judged."""

    rtol: float  # the relative line (derived, given); under "measured", the multiple of the floor
    atol: float
    source: str
    rule: Rule = "given"
    floors: Dict[Tuple[int, str], float] = field(default_factory=dict)  # (step, kind) -> pooled floor
    minimum: float = 0.0  # the smallest relative floor the measured rule assumes (the dtype's eps)
    own: Dict[Tuple[int, str, str], float] = field(default_factory=dict)  # (step, kind, name) -> its own

    def rel_line(self, step: Optional[int] = None, kind: Optional[str] = None, name: str = "") -> float:
        """The relative line ||strategy - reference|| / ||reference|| at this step for this kind
        (and tensor: one whose own measured floor is higher keeps it)."""
        if self.rule != "measured":
            return self.rtol
        floor = self.floors.get((step, kind)) if step is not None and kind is not None else None
        if floor is None:  # a step or kind nothing was measured for: the loosest line of the run
            floor = max(self.floors.values(), default=self.minimum)
        own = self.own.get((step, kind, name), 0.0) if step is not None and kind is not None else 0.0
        return self.rtol * max(floor, own, self.minimum)

    def bound(self, e: TensorError, step: Optional[int] = None) -> float:
        """The largest ||strategy - reference|| this tensor may have."""
        rel = self.rel_line(step, e.kind, e.name)
        atol = rel * ATOL_FACTOR if self.rule == "measured" else self.atol
        if e.name.startswith("rank ") and ": " in e.name and rel > REPLICA_LINE:  # replicas against each other
            rel, atol = REPLICA_LINE, min(atol, REPLICA_LINE * ATOL_FACTOR)
        return atol * math.sqrt(max(1, e.numel)) + rel * e.norm_ref

    def passes(self, e: TensorError, step: Optional[int] = None) -> bool:
        if self.rule == "bitwise" or (self.rtol == 0 and self.atol == 0):
            return e.max_abs == 0
        return math.isfinite(e.norm_err) and e.norm_err <= self.bound(e, step)

    def ratio(self, e: TensorError, step: Optional[int] = None) -> float:
        """How far along the line this tensor is: error / bound (1 is the line; > 1 fails)."""
        if e.norm_err == 0 and e.max_abs == 0:
            return 0.0
        bound = self.bound(e, step)
        return e.norm_err / bound if bound > 0 and math.isfinite(e.norm_err) else math.inf

    def describe(self) -> str:
        if self.rule == "bitwise" or (self.rtol == 0 and self.atol == 0):
            return f"bitwise ({self.source})"
        if self.rule == "measured":
            return f"{self.rtol:.3g} x the measured roundoff floor of each step ({self.source})"
        return f"rtol={self.rtol:.3g}, atol={self.atol:.3g} ({self.source})"


def derive_tolerance(facts: RunFacts, steps: int = 0) -> Tolerance:
    """rtol = sqrt(eps(dtype)) * sqrt(partial sums reordered): the rule where no shadow ran.

    sqrt(eps): half the significant digits survive a few training steps of a deep network. It is a
    guess, not a measurement: it sits 4x below MobileNetV2-GN's own float32 noise at step 1 and far
    above a small real bug at step 0, which is why a float64 shadow judges wherever one can run."""
    eps = EPS.get(facts.dtype, EPS["float32"])
    parts = partial_sums(facts)
    rtol = math.sqrt(eps) * math.sqrt(parts)
    why = f"derived: sqrt({facts.dtype} eps {eps:.3g})"
    if parts > 1:
        why += f" x sqrt({parts} partial sums)"
    return Tolerance(rtol, rtol * ATOL_FACTOR, why, "derived")


# A tensor whose reference and companion differ by more than this fraction of its size carries no
# significant digits (a conv bias in front of a norm layer: its true gradient is 0, its float32 and
# float64 values are both roundoff, gap/size ~1). Its relative gap says nothing about the model's
# conditioning, so it keeps its own floor and does not set the line of the others. Kink flips stay
# below it: measured on ResNet18-GN, the largest gap of a flipped step was 6% (median 3.5%).
SIGNIFICANT = 0.1


# A tensor whose running floor is this many times its kind's median carries chaos of its own, not the
# model's conditioning: under Adam, elements whose gradient is roundoff (an attention key bias, whose
# exact gradient is zero) move by about lr x sign(roundoff) each step, so two valid float32 runs part
# there by O(lr x steps) (a small causal LM: 1e-2 relative from step 1, while every other parameter
# stayed within 7e-7, 1.4e-7 at the median). Such a tensor keeps its own floor and never sets the line
# of the others (nor, in loops that are not re-synchronized, the gradients'). The margin on both
# sides: measured in docs/design/parity-calibration.md.
CHAOS = 100.0
# A kind needs this many tensors for a median to say what is typical of it.
CHAOS_MIN_TENSORS = 3


def pooled_floors(records: Iterable[StepRecord], attr: str = "floor"
                  ) -> Tuple[Dict[Tuple[int, str], float], Dict[Tuple[int, str, str], float]]:
    """Running maxima of the relative gaps (``attr``: "floor" for the float64 shadow, "twin" for the
    twin): per (step, kind) over the tensors with significant digits that are not chaotic (``CHAOS``),
    and per tensor."""
    pooled: Dict[Tuple[int, str], float] = {}
    own: Dict[Tuple[int, str, str], float] = {}
    worst: Dict[str, float] = {}
    mine: Dict[Tuple[str, str], float] = {}
    for rec in records:
        now: Dict[Tuple[str, str], float] = {}
        for e in rec.errors:
            gap = getattr(e, attr)
            if not (math.isfinite(gap) and e.norm_ref > 0 and math.isfinite(e.norm_ref)):
                continue
            now[(e.kind, e.name)] = rel = gap / e.norm_ref
            mine[(e.kind, e.name)] = max(mine.get((e.kind, e.name), 0.0), rel)
        typical = _medians(mine)
        for key, rel in now.items():
            kind = key[0]
            chaotic = kind in typical and mine[key] > CHAOS * typical[kind]
            if rel <= SIGNIFICANT and not chaotic:
                worst[kind] = max(worst.get(kind, 0.0), rel)
            else:
                worst.setdefault(kind, 0.0)
        for kind, value in worst.items():
            pooled[(rec.step, kind)] = value
        for (kind, name), value in mine.items():
            own[(rec.step, kind, name)] = value
    return pooled, own


def _medians(mine: Dict[Tuple[str, str], float]) -> Dict[str, float]:
    """Per kind with enough tensors, the median of their running floors (above zero)."""
    by_kind: Dict[str, List[float]] = {}
    for (kind, _), value in mine.items():
        by_kind.setdefault(kind, []).append(value)
    typical = {kind: statistics.median(v) for kind, v in by_kind.items() if len(v) >= CHAOS_MIN_TENSORS}
    return {kind: m for kind, m in typical.items() if m > 0}


def twin_loss_agrees(twin_gap: float, loss: float, shadow_rel: Optional[float], facts: RunFacts) -> bool:
    """The twin's step-0 loss is within the loss line (``shadow_rel``: the shadow's relative loss
    gap; None without a shadow, then the derived rule draws it). Used by the judge and, to retire
    the shadow early, by rank 0."""
    eps = EPS.get(facts.dtype, EPS["float32"])
    if shadow_rel is None:
        rel = derive_tolerance(facts).rtol
    else:
        rel = MULTIPLE * math.sqrt(partial_sums(facts)) * max(shadow_rel, eps)
    return math.isfinite(twin_gap) and twin_gap <= rel * abs(loss)


def twin_qualifies(records: List[StepRecord], shadow: Dict[Tuple[int, str], float],
                   facts: RunFacts) -> Tuple[bool, str]:
    """Whether the twin (the strategy's summation order in one process) may set the line.

    A kink flip is continuous in the forward pass, so it leaves the loss where it was; a model-level
    trap the twin shares with the strategy (BatchNorm per shard, dropout, a 'sum' loss, padding, a
    loss that depends on the batch size) moves it. So the twin counts only if its step-0 loss is
    within the line that the shadow (or, without one, the derived rule) draws for the loss."""
    first = records[0] if records else None
    loss = next((e for e in (first.errors if first else []) if e.kind == "loss"), None)
    if loss is None or not math.isfinite(loss.twin):
        return False, ""
    shadow_gap = shadow.get((0, "loss")) if shadow else None
    if twin_loss_agrees(loss.twin, loss.norm_ref, shadow_gap, facts):
        return True, ""
    gap = loss.twin / loss.norm_ref if loss.norm_ref > 0 else math.inf
    return False, (f"the model alone, split as the strategy splits the batch, already moves the step-0 loss "
                   f"by {gap:.3g} (relative) in one process: the cause is in the model or the loss, not in "
                   "the distributed run")


def _merge(a: Dict, b: Dict) -> Dict:
    return {key: max(a.get(key, 0.0), b.get(key, 0.0)) for key in set(a) | set(b)}


def across_kinds(floors: Dict[Tuple[int, str], float]) -> Dict[Tuple[int, str], float]:
    """From step 1 on, every kind takes the step's largest pooled floor: for loops that are not
    re-synchronized (the user's own, in ``assert_same_training``).

    Why: at step 0 both sides share one state and each kind's own roundoff is the measure; after
    that the states themselves drift apart, and a gradient or a loss computed from a drifted state is
    off by as much as the state is, in whichever kind that shows. Measured (benchmarks/
    parity_calibration.py --loops, 50 correct runs of 100 steps): pooled per kind, a correct float32
    minGPT run at W=2 came to 1.2 x the line (a LayerNorm bias gradient at step 29, 37x the twin's
    gradient gap, while the twin's parameters were as far apart as the ranks'); across kinds, the
    worst correct run is at 0.21, and the weakest of 120 bug runs still fails at 2.9."""
    by_step: Dict[int, float] = {}
    for (step, _), value in floors.items():
        if step > 0:
            by_step[step] = max(by_step.get(step, 0.0), value)
    return {(step, kind): by_step.get(step, value) if step > 0 else value for (step, kind), value in floors.items()}


def measure_tolerance(records: Iterable[StepRecord], facts: RunFacts) -> Tuple[Optional[Tolerance], str]:
    """The measured rule (or None where nothing was measured), and a note on the twin."""
    records = list(records)
    shadow, shadow_own = pooled_floors(records, "floor")
    parts = partial_sums(facts)
    multiple = MULTIPLE * math.sqrt(parts)
    trusted, note = twin_qualifies(records, shadow, facts)
    twin, twin_own = pooled_floors(records, "twin") if trusted else ({}, {})
    floors = _merge(shadow, twin)
    if not floors:
        return None, note
    if not facts.resynced:
        floors = across_kinds(floors)
    used = " and ".join(w for w, f in (("float64 shadow", shadow), ("float32 twin in the strategy's order", twin)) if f)
    why = f"measured: reference vs {used}, pooled per step; {MULTIPLE:g}"
    why += f" x sqrt({parts} partial sums)" if parts > 1 else ""
    eps = EPS.get(facts.dtype, EPS["float32"])
    return Tolerance(multiple, 0.0, why, "measured", floors, eps, _merge(shadow_own, twin_own)), note
