"""Timing inside ranks: ``benchmark(dist, fn, ...)`` -> ``Measurement``.

Split as in ``torch.utils.benchmark``: a ``TaskSpec`` says what ran (function, strategy, group,
world size, batch), a ``Measurement`` what came out (samples per iteration and per rank, memory).

The rank side (barriers, syncs, the A B A B loop with the in-run reference) is in ``inrank``. An
iteration's step time is its slowest rank's: the others wait for it at the next collective; the
same for the reference. A measurement whose samples are not sane is re-measured once and, if still
unstable, marked so (never judged or saved); non-finite samples are refused, naming the rank.
"""
from __future__ import annotations

import functools
import math
import statistics
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Tuple

from ..launch.protocol import pack_call
from .arguments import loop_config, resolve_global_batch
from .inrank import DEFAULT_MIN_RUN_TIME, LoopConfig, RankTiming, rank_loop
from .reference import UNNORMALIZED_HASH, gate_reference_hash
from .structure.figures import CallStructure, of_benchmark
from .units import fmt_bytes, fmt_time

if TYPE_CHECKING:
    from .revision import RevisionResult

# Sanity limits of one measurement (a split-size sweep gave a single-device median of
# 2.916 s with an IQR of 1.9 s in one run and 298.7 ms in an identical one). Beyond these the
# samples do not describe one speed: re-measure once, then mark the measurement unstable.
UNSTABLE_IQR = 0.6  # IQR over the median (the report that asked for this: 65%)
UNSTABLE_DRIFT = 1.0  # first third's median vs last third's, either way (2x)


# -- what ran ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TaskSpec:
    """What was timed, and how the report should place it.

    ``group`` collects rows that are compared with each other (e.g. "resnet50-b32"): the report
    computes each row's speed-up over the group's one-device row. ``strategy`` names the row
    ("single", "dp", "ddp", "fsdp", "pipeline"); ``params`` adds what varies within a strategy
    (e.g. ``{"split_size": 8}``). ``batch_size`` is the number of samples one step processes over
    all ranks together (the global batch); it gives throughput. ``batch_keyword`` is the keyword it
    was given as: ``global_batch``, or the older ``batch_size``, whose meaning the report questions
    where it looks per-rank.
    """

    name: str
    label: str  # the test's node id
    fn: str  # module:qualname of the timed function
    strategy: str
    group: str
    world_size: int  # devices the test holds (its gpuN)
    processes: int  # ranks that ran: world_size, or 1 for single-process (DP, model parallel)
    backend: str
    device_type: str
    emulated: bool
    batch_size: Optional[int] = None
    params: Dict[str, Any] = field(default_factory=dict)
    batch_keyword: str = ""  # "global_batch" or "batch_size": how the test gave batch_size
    warmup: Optional[int] = None  # as asked; None: calibrated
    repeat: Optional[int] = None
    min_run_time: float = DEFAULT_MIN_RUN_TIME

    @property
    def key(self) -> str:
        """The measurement's identity in baselines and reports."""
        return f"{self.label}::{self.name}"

    def where(self) -> str:
        kind = f"{self.world_size} x {self.device_type} ({self.backend}"
        return kind + (", emulated)" if self.emulated else ")")


# -- what came out ----------------------------------------------------------------------------------
def _quartiles(xs: Sequence[float]):
    if len(xs) < 2:
        return xs[0], xs[0]
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], q[2]


@dataclass
class Measurement:
    """One timed step, as ``dist.benchmark`` returns it (``median``, ``iqr``: seconds; ``format()``: text).

    Attributes:
        task: What was timed and how the report places it (name, strategy, group, world size).
        samples: Seconds per timed iteration, each the slowest rank's.
        rank_samples: Per rank, its seconds per iteration.
        warmup: Warm-up iterations that ran.
        peak_mem_bytes: Per rank, the peak tensor memory of the step (None where unknown).
        mem_source: How the peak was read (CUDA's allocator, or the profiler's CPU allocations).
        reference_samples: The in-run reference workload's seconds, timed beside each iteration.
        reference_hash: Which reference workload produced them.
        unstable: Why the samples do not describe one speed ("" when they do); never judged.
        remeasured: Re-measurements taken (for instability, or to confirm a regression).
        remeasure: Measures the step again (None where the revision lane measured it).
        revision: Under ``--mgpu-against``: the head/base pairs and their verdict.
        structure: The collectives, bytes and memory per step, judged against the structure goldens.
        lane_only: The samples are the revision lane's head turns, judged by the lane alone.
    """

    task: TaskSpec
    samples: List[float]  # seconds per iteration; each the slowest rank's time
    rank_samples: List[List[float]]
    warmup: int  # warmup iterations that ran
    peak_mem_bytes: List[Optional[int]] = field(default_factory=list)  # per rank
    mem_source: str = ""
    reference_samples: List[float] = field(default_factory=list)  # the in-run reference, per iteration
    reference_hash: str = ""  # which reference workload (reference.REFERENCE_HASH) produced them
    unstable: str = ""  # why the samples do not describe one speed (after one re-measurement)
    remeasured: int = 0  # re-measurements taken: for instability, or to confirm a flagged regression
    remeasure: Optional[Callable[[], "Measurement"]] = field(default=None, repr=False, compare=False)
    revision: Optional["RevisionResult"] = None  # --mgpu-against: the head/base pairs and their verdict
    structure: Optional[CallStructure] = field(default=None, repr=False, compare=False)  # timing.structure
    lane_only: bool = False  # the samples are the revision lane's head turns: judged by the lane, not the history

    @property
    def reference_median(self) -> Optional[float]:
        return statistics.median(self.reference_samples) if self.reference_samples else None

    @property
    def x(self) -> Optional[float]:
        """The gate's statistic of this launch: ln(step median / reference median); on a GPU
        ln(step median) (``reference.normalizes``)."""
        if self.reference_hash == UNNORMALIZED_HASH:
            return math.log(self.median) if self.median > 0 else None
        ref = self.reference_median
        return math.log(self.median / ref) if ref and self.median > 0 else None

    @property
    def median(self) -> float:
        return statistics.median(self.samples)

    @property
    def iqr(self) -> float:
        q1, q3 = _quartiles(self.samples)
        return q3 - q1

    @property
    def rank_medians(self) -> List[float]:
        return [statistics.median(s) for s in self.rank_samples]

    @property
    def slowest_rank(self) -> int:
        meds = self.rank_medians
        return max(range(len(meds)), key=meds.__getitem__)

    @property
    def skew(self) -> float:
        """How much slower the slowest rank's median is than the fastest's (0.05 = 5%)."""
        meds = self.rank_medians
        return max(meds) / min(meds) - 1.0 if min(meds) > 0 else 0.0

    @property
    def throughput(self) -> Optional[float]:
        """Samples per second over all ranks, when the batch size is known."""
        if not self.task.batch_size:
            return None
        return self.task.batch_size / self.median

    def format(self) -> str:
        t = self.task
        lines = [
            f"{t.key}  [{t.strategy}, {t.where()}]",
            f"  median {fmt_time(self.median)}  IQR {fmt_time(self.iqr)}  "
            f"({len(self.samples)} iterations after {self.warmup} warmup)"
            + (f"  {self.throughput:.1f} samples/s" if self.throughput else ""),
        ]
        if len(self.rank_samples) > 1:
            meds = ", ".join(fmt_time(m) for m in self.rank_medians)
            lines.append(f"  rank medians {meds}; slowest rank {self.slowest_rank} (+{self.skew * 100:.1f}%)")
        if any(m is not None for m in self.peak_mem_bytes):
            lines.append(f"  peak memory per rank ({self.mem_source}): "
                         + ", ".join(fmt_bytes(m) for m in self.peak_mem_bytes))
        if self.unstable:
            lines.append(f"  unstable: {self.unstable} (after re-measuring): not judged, not saved")
        if self.revision is not None:
            lines.append("  " + self.revision.format())
        return "\n".join(lines)

    def __repr__(self) -> str:
        return f"<Measurement {self.task.key}: median {fmt_time(self.median)}, n={len(self.samples)}>"

    def to_dict(self) -> dict:
        """Plain JSON data (what travels in report.user_properties and into report files)."""
        return {
            "task": asdict(self.task),
            "key": self.task.key,
            "samples_s": list(self.samples),
            "rank_samples_s": [list(s) for s in self.rank_samples],
            "warmup": self.warmup,
            "peak_mem_bytes": list(self.peak_mem_bytes),
            "mem_source": self.mem_source,
            "median_s": self.median,
            "iqr_s": self.iqr,
            "q1_s": _quartiles(self.samples)[0],
            "q3_s": _quartiles(self.samples)[1],
            "throughput": self.throughput,
            "rank_medians_s": self.rank_medians,
            "slowest_rank": self.slowest_rank,
            "skew": self.skew,
            "reference_samples_s": list(self.reference_samples),
            "reference_median_s": self.reference_median,
            "reference_hash": self.reference_hash,
            "x": self.x,
            "unstable": self.unstable,
            "remeasured": self.remeasured,
            "revision": self.revision.to_dict() if self.revision is not None else None,
            "lane_only": self.lane_only,
        }

    @classmethod
    def from_dict(cls, d: dict) -> "Measurement":
        task = TaskSpec(**{k: v for k, v in d["task"].items() if k in TaskSpec.__dataclass_fields__})
        revision = None
        if d.get("revision"):
            from .revision import RevisionResult

            revision = RevisionResult.from_dict(d["revision"])
        return cls(task, list(d["samples_s"]), [list(s) for s in d["rank_samples_s"]], d["warmup"],
                   list(d.get("peak_mem_bytes", [])), d.get("mem_source", ""),
                   list(d.get("reference_samples_s") or []), d.get("reference_hash", ""),
                   d.get("unstable", ""), d.get("remeasured", 0), revision=revision,
                   lane_only=bool(d.get("lane_only")))


def instability(samples: Sequence[float]) -> str:
    """Why ``samples`` do not describe one speed ('' when they do): spread or drift too large."""
    if len(samples) < 3:
        return ""
    med = statistics.median(samples)
    q1, q3 = _quartiles(samples)
    if med > 0 and (q3 - q1) / med > UNSTABLE_IQR:
        return f"IQR {(q3 - q1) / med * 100:.0f}% of the median (limit {UNSTABLE_IQR * 100:.0f}%)"
    third = max(1, len(samples) // 3)
    first, last = statistics.median(samples[:third]), statistics.median(samples[-third:])
    if min(first, last) > 0 and max(first, last) / min(first, last) > 1 + UNSTABLE_DRIFT:
        return (f"samples drifted from {fmt_time(first)} to {fmt_time(last)} within the run "
                f"(limit {UNSTABLE_DRIFT * 100:.0f}%)")
    return ""


def refuse_non_finite(timings: Sequence[RankTiming]) -> None:
    """NaN or inf step times would poison every statistic downstream: say which rank gave them."""
    for t in timings:
        bad = [v for v in list(t.samples) + list(t.reference_samples) if not math.isfinite(v)]
        if bad:
            raise ValueError(f"dist.benchmark: rank {t.rank} produced non-finite times ({bad[0]!r}); "
                             "the measurement is refused. Is the clock or a patched time function broken?")


# -- in the test process ----------------------------------------------------------------------------
def benchmark(
    dist,
    fn,
    *args,
    warmup: Optional[int] = None, repeat: Optional[int] = None, name: Optional[str] = None,
    batch_size: Optional[int] = None, strategy: Optional[str] = None, group: Optional[str] = None,
    params: Optional[Dict[str, Any]] = None, single_process: bool = False, min_run_time: Optional[float] = None,
    timeout: Optional[float] = None, global_batch: Optional[int] = None, **kwargs,
) -> Measurement:
    """Time a training step in every rank of ``dist`` and return a ``Measurement``.

    ``fn(*args, **kwargs)`` runs once in each rank (a module-level function, as for ``dist.run``).
    If it returns a callable, that callable is the step that is timed, and ``fn`` was its setup
    (build the model, optimizer and batch there). Otherwise ``fn`` itself is the step, called with
    the same arguments every iteration (its first call counts as setup).

    warmup, repeat: iteration counts; calibrated when None (warmup until two iterations agree
        within 10%, then enough iterations for ``min_run_time`` seconds, at least 5).
    name: the measurement's name within the test (default: ``strategy`` or the function's name).
    global_batch: samples per step over all ranks together (the per-rank batch times the ranks, or
        the batch the ranks split); gives throughput and the speed-up. ``batch_size``: its older name.
    strategy, group, params: how the report labels and compares the row (see ``TaskSpec``); group
        defaults to the test's name, so ``world_sizes(1, 2, 4)`` variants compare with each other.
    single_process: run one process that sees all the test's devices (DataParallel, model
        parallel) instead of one rank per device.
    timeout: seconds for the whole call, as in ``dist.run``. (Under ``--mgpu-against`` the lane times it.)
    """
    __tracebackhide__ = True
    if getattr(getattr(dist, "plan", None), "shared_gpus", 0):
        import pytest

        pytest.skip("dist.benchmark does not time ranks sharing a GPU (--mgpu-fallback=share): their times "
                    "measure each other's turns, not the step. Time on GPUs of their own, or CPU ranks")
    loop = loop_config(warmup, repeat, min_run_time)
    batch_size, batch_keyword = resolve_global_batch(global_batch, batch_size)
    ref, payload = pack_call(fn, args, kwargs)  # clear errors for unsendable functions and arguments
    run = functools.partial(_launch, dist, ref, args, kwargs, loop, single_process, timeout)
    revision, timings = _lane_timings(dist, ref, payload, loop, single_process, timeout)
    lane_only = bool(timings)  # the lane's head side is the measurement: its pairs judge it, not the history
    timings = timings or run()
    recorded: Optional[List[Measurement]] = getattr(dist, "measurements", None)
    strategy = strategy or name or fn.__name__
    label = getattr(dist, "label", "dist.benchmark")
    task = TaskSpec(
        name=_unique_name(name or strategy, recorded), label=label, fn=f"{ref.module}:{ref.qualname}",
        strategy=strategy, group=group or label.split("[", 1)[0].rsplit("::", 1)[-1], world_size=dist.world_size,
        processes=len(timings), backend=dist.backend, device_type=dist.device_type, emulated=dist.emulated,
        batch_size=batch_size, params=dict(params or {}), warmup=loop.warmup, repeat=loop.repeat,
        min_run_time=loop.min_run_time, batch_keyword=batch_keyword,
    )
    m = _assemble(task, timings, lane_only=lane_only)
    if m.unstable:  # once more; if it stays unstable it is marked, and never judged or saved
        m = _assemble(task, run(), remeasured=1)
    if not m.lane_only:
        m.remeasure = functools.partial(_remeasure, task, run, m.remeasured)
    m.revision = revision
    if recorded is not None:
        recorded.append(m)
    return m


def _lane_timings(dist, ref, payload: bytes, loop: LoopConfig, single_process: bool,
                  timeout) -> Tuple[Optional["RevisionResult"], List[RankTiming]]:
    """Under ``--mgpu-against``: the revision lane's measurement and its head side's timings, which
    are the benchmark's (none where the lane timed nothing: new in this change, or REV failed)."""
    lane = getattr(dist, "against", None)  # set on the test's dist by timing.plugin
    if lane is None:
        return None, []
    revision, timings = lane.measure(dist, ref, payload, loop, single_process, timeout)
    refuse_non_finite(timings)
    return revision, timings


def _unique_name(name: str, recorded: Optional[List[Measurement]]) -> str:
    """``name``, or ``name#2``, ``name#3``... when the test already measured one by that name."""
    if recorded is None:
        return name
    taken = {m.task.name for m in recorded}
    base, k = name, 2
    while name in taken:
        name, k = f"{base}#{k}", k + 1
    return name


def _launch(dist, ref, args, kwargs, loop: LoopConfig, single_process: bool, timeout) -> List[RankTiming]:
    if single_process:
        timings = [dist.run_single(rank_loop, ref, args, kwargs, loop, timeout=timeout)]
    else:
        timings = dist.run(rank_loop, ref, args, kwargs, loop, timeout=timeout)
    refuse_non_finite(timings)
    return timings


def _reference_hash(task: TaskSpec, timings: Sequence[RankTiming]) -> str:
    if not timings[0].reference_samples:
        return ""
    return gate_reference_hash(task.device_type, task.emulated)


def _assemble(task: TaskSpec, timings: Sequence[RankTiming], remeasured: int = 0, lane_only: bool = False) -> Measurement:
    """One Measurement from every rank's timings: per iteration, the slowest rank's time. ``lane_only``:
    the revision lane's head turns, which its pairs judge (never unstable for the history)."""
    m = Measurement(
        task=task,
        samples=[max(col) for col in zip(*(t.samples for t in timings))],
        rank_samples=[list(t.samples) for t in timings],
        warmup=len(timings[0].warmup_samples),
        peak_mem_bytes=[t.peak_mem_bytes for t in timings],
        mem_source=timings[0].mem_source,
        reference_samples=[max(col) for col in zip(*(t.reference_samples for t in timings))],
        reference_hash=_reference_hash(task, timings),
        remeasured=remeasured,
        structure=of_benchmark(task.name, task.world_size, {t.rank: list(t.structure) for t in timings},
                               task.device_type),
    )
    m.lane_only = lane_only
    m.unstable = "" if lane_only else instability(m.samples)
    return m


def _remeasure(task: TaskSpec, run: Callable[[], List[RankTiming]], before: int) -> Measurement:
    """The same measurement launched again (the gate's confirmation of a flagged regression)."""
    return _assemble(task, run(), remeasured=before + 1)
