"""What crosses the process boundary in a parity run: the job sent to the ranks, and the raw errors
that rank 0 sends back. Small picklable dataclasses, no torch import at module level.

The ranks only *measure* (max abs error and reference scale per tensor and step); the test process
*judges* them against the tolerance, so that a tolerance change never needs a new run.
"""
from __future__ import annotations

import functools
import math
import pickle
from dataclasses import dataclass, field
from typing import Any, Dict, Final, List, Literal, Optional, Tuple, get_args

from ..launch.byvalue import importable
from ..launch.protocol import BadCallError, FnRef

# What a compared tensor is; the report lists kinds in this order.
Kind = Literal["loss", "output", "grad", "param", "buffer"]
KINDS: Final[Tuple[Kind, ...]] = get_args(Kind)


@dataclass(frozen=True)
class Portable:
    """A user callable on its way to the ranks.

    A module-level function travels as a reference. A ``functools.partial`` or a callable object (e.g.
    ``nn.CrossEntropyLoss(reduction="sum")``) travels pickled, together with a reference to its
    function or class: resolving that first imports the module that defines it, also where that
    module is a test file that only pytest knows how to import (the reference has its file). A nested
    function or lambda, or a partial of one, travels by value (cloudpickle, inside ``ref``).
    """

    ref: FnRef
    blob: Optional[bytes] = None

    @classmethod
    def of(cls, obj, what: str) -> "Portable":
        __tracebackhide__ = True  # a value that cannot travel is the caller's line, not ours
        if not callable(obj):
            raise BadCallError(f"{what} must be callable, got {type(obj).__name__}: {obj!r}")
        if isinstance(obj, functools.partial):
            anchor = obj.func
        elif hasattr(obj, "__qualname__") and hasattr(obj, "__module__"):
            anchor = None  # a function or class: a reference is enough
        else:
            anchor = type(obj)
        if anchor is None or not importable(anchor):  # a function, or what only travels by value
            return cls(FnRef.of(obj, what))
        try:
            blob = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:  # e.g. a partial holding a lambda: the whole of it travels by value
            return cls(FnRef.by_value(obj, what))
        return cls(FnRef.of(anchor), blob)

    def load(self):
        target = self.ref.resolve()
        return target if self.blob is None else pickle.loads(self.blob)


@dataclass(frozen=True)
class ParityJob:
    """One parity run, as every rank receives it."""

    strategy: str
    model_fn: Portable
    batch_fn: Portable
    loss_fn: Portable
    optimizer_fn: Portable
    steps: int
    deterministic: bool
    world_size: int  # the test's world size: devices of a single-process strategy when emulated
    options: Dict[str, Any] = field(default_factory=dict)
    shadow: bool = True  # train a float64 shadow of the reference (the measured tolerance needs it)
    deterministic_kernels: bool = False  # cuDNN deterministic, without torch's deterministic-only mode


@dataclass
class TensorError:
    """How far one tensor of the strategy is from the reference at one step."""

    kind: Kind
    name: str
    shape: Tuple[int, ...]
    max_abs: float  # max |strategy - reference|; inf where one side is NaN/inf and the other is not
    scale: float  # max |reference|: what the error is relative to
    norm_ratio: float = 1.0  # ||strategy|| / ||reference||: a constant != 1 means a scaling bug
    missing: str = ""  # "strategy" / "reference": the tensor (or its grad) exists on one side only
    norm_err: float = 0.0  # ||strategy - reference||_2
    norm_ref: float = 0.0  # ||reference||_2
    numel: int = 0
    # ||reference - float64 shadow||_2: the model's own float32 roundoff at this step (NaN: no shadow)
    floor: float = math.nan
    # ||reference - float32 twin in the strategy's summation order||_2 (NaN: no twin)
    twin: float = math.nan

    @property
    def rel(self) -> float:
        """Norm-wise relative error ||strategy - reference|| / ||reference||: what is judged."""
        if self.norm_err == 0.0:
            return 0.0 if self.max_abs == 0.0 else (self.max_abs / self.scale if self.scale > 0 else math.inf)
        return self.norm_err / self.norm_ref if self.norm_ref > 0 else math.inf

    @property
    def max_rel(self) -> float:
        if self.max_abs == 0.0:
            return 0.0
        return self.max_abs / self.scale if self.scale > 0 else math.inf


@dataclass
class StepRecord:
    step: int
    errors: List[TensorError] = field(default_factory=list)


@dataclass
class RunFacts:
    """What rank 0 learnt about the model, the data and the strategy: the input of the hints."""

    strategy: str
    world_size: int
    dtype: str = "float32"  # the parameters' dtype; "tf32" when CUDA fp32 runs on TF32 units
    device: str = "cpu"
    batchnorm: List[str] = field(default_factory=list)  # BatchNorm modules that are not SyncBatchNorm
    dropout: List[str] = field(default_factory=list)  # active dropout modules (p > 0)
    loss_reduction: Optional[str] = None
    batch_sizes: List[int] = field(default_factory=list)  # global batch per step
    shard_sizes: List[int] = field(default_factory=list)  # per rank (data-parallel strategies)
    microbatches: int = 1  # micro-batches per step (pipelines, accumulation)
    unused: List[str] = field(default_factory=list)  # parameters without a reference gradient
    stages: List[List[str]] = field(default_factory=list)  # top-level modules per stage
    exact: bool = False  # the strategy computes in the reference's order: bitwise is possible
    exact_note: str = ""  # why it is or is not
    shadow_note: str = ""  # why there is no float64 shadow ("" when there is one)
    twin_note: str = ""  # why there is no twin ("" when there is one)
    # every step starts both sides from one state (assert_parity re-synchronizes them); False for the
    # user's own loops, which drift apart (tolerance.across_kinds)
    resynced: bool = True


@dataclass
class RankResult:
    """What rank 0 returns from a parity run."""

    records: List[StepRecord]
    facts: RunFacts


@dataclass
class RankOutput:
    """What every rank of a parity run returns: rank 0's result (None elsewhere), and the rank's
    structure per training step (``timing.structure.figures.StepStructure``)."""

    result: Optional[RankResult]
    structure: List[Any] = field(default_factory=list)
