"""Timing inside ranks: ``benchmark(dist, fn, ...)`` -> ``Measurement``.

Split as in ``torch.utils.benchmark``: a ``TaskSpec`` says what ran (function, strategy, group,
world size, batch), a ``Measurement`` what came out (samples per iteration and per rank, memory).

Every rank times its own iterations: a barrier first so that ranks start together, then
``torch.cuda.synchronize`` on every GPU the rank touched before reading the clock at both ends
(``torch.utils.benchmark`` synchronizes only the current device, which under-times model-parallel
steps). An iteration's step time is its slowest rank's: the others wait for it at the next
collective. Counts are agreed between ranks (an all_reduce of the calibration time), since ranks
that disagree on the number of barriers would hang.
"""
from __future__ import annotations

import functools
import math
import statistics
import time
from dataclasses import asdict, dataclass, field
from typing import Any, Callable, Dict, List, Optional, Sequence

from ..launch.protocol import FnRef, pack_call

MIN_REPEAT = 5  # fewer samples cannot reach p < 0.01 in the gate's U test (see gate.min_p)
MAX_REPEAT = 500
MIN_WARMUP = 2  # the first iteration is cold (allocator, cudnn autotune, lazy init)
MAX_WARMUP = 20
STABLE = 0.10  # warmup ends when two consecutive iterations agree within 10%
DEFAULT_MIN_RUN_TIME = 1.0  # seconds of timed iterations when `repeat` is not given


# -- what ran ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TaskSpec:
    """What was timed, and how the report should place it.

    ``group`` collects rows that are compared with each other (e.g. "resnet50-b32"): the report
    computes each row's speed-up over the group's one-device row. ``strategy`` names the row
    ("single", "dp", "ddp", "fsdp", "pipeline"); ``params`` adds what varies within a strategy
    (e.g. ``{"split_size": 8}``). ``batch_size`` is the number of samples one step processes over
    all ranks together (the global batch); it gives throughput.
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


@dataclass
class RankTiming:
    """What one rank measured; crosses the process boundary."""

    rank: int
    samples: List[float]
    warmup_samples: List[float]
    devices: List[str]
    peak_mem_bytes: Optional[int]
    mem_source: str
    threads: int


# -- what came out ----------------------------------------------------------------------------------
def fmt_time(seconds: Optional[float]) -> str:
    if seconds is None or math.isnan(seconds):
        return "-"
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("us", 1e-6)):
        if abs(seconds) >= scale:
            return f"{seconds / scale:.4g} {unit}"
    return f"{seconds * 1e9:.4g} ns"


def fmt_bytes(n: Optional[float]) -> str:
    if n is None:
        return "-"
    return f"{n / 2**20:.0f} MiB" if abs(n) >= 2**20 else f"{n / 2**10:.0f} KiB"


def _quartiles(xs: Sequence[float]):
    if len(xs) < 2:
        return xs[0], xs[0]
    q = statistics.quantiles(xs, n=4, method="inclusive")
    return q[0], q[2]


@dataclass
class Measurement:
    """Samples of one timed step: per iteration (slowest rank) and per rank, plus peak memory."""

    task: TaskSpec
    samples: List[float]  # seconds per iteration; each the slowest rank's time
    rank_samples: List[List[float]]
    warmup: int  # warmup iterations that ran
    peak_mem_bytes: List[Optional[int]] = field(default_factory=list)  # per rank
    mem_source: str = ""

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
        }

    @classmethod
    def from_dict(cls, d: dict) -> "Measurement":
        task = TaskSpec(**{k: v for k, v in d["task"].items() if k in TaskSpec.__dataclass_fields__})
        return cls(task, list(d["samples_s"]), [list(s) for s in d["rank_samples_s"]], d["warmup"],
                   list(d.get("peak_mem_bytes", [])), d.get("mem_source", ""))


# -- inside a rank ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class LoopConfig:
    warmup: Optional[int]
    repeat: Optional[int]
    min_run_time: float


class _HeapPeak:
    """Peak bytes in use on the C heap (glibc ``mallinfo2``) while a step runs, sampled by a thread.

    CPU tensors come from malloc, and torch keeps no CPU allocator statistics; RSS is no substitute
    (freed memory stays resident in malloc's arenas, so a peak RSS mostly says how much was ever
    used). Sampling every millisecond misses only allocations shorter than that.
    """

    def __init__(self):
        import ctypes

        class _Info(ctypes.Structure):
            _fields_ = [(n, ctypes.c_size_t) for n in ("arena", "ordblks", "smblks", "hblks", "hblkhd",
                                                        "usmblks", "fsmblks", "uordblks", "fordblks", "keepcost")]

        try:
            fn = ctypes.CDLL(None).mallinfo2
        except (OSError, AttributeError):
            self._fn = None
            return
        fn.restype = _Info
        self._fn = fn

    @property
    def available(self) -> bool:
        return self._fn is not None

    def in_use(self) -> int:
        info = self._fn()
        return int(info.uordblks + info.hblkhd)

    def during(self, step: Callable[[], Any], interval_s: float = 0.001) -> int:
        import threading

        peak = [self.in_use()]
        done = threading.Event()

        def sample():
            while not done.is_set():
                peak[0] = max(peak[0], self.in_use())
                done.wait(interval_s)

        t = threading.Thread(target=sample, name="mgpu-heap-sampler", daemon=True)
        t.start()
        try:
            step()
        finally:
            done.set()
            t.join()
        return max(peak[0], self.in_use())


class _Clock:
    """Barrier, device sync and agreement for one rank."""

    def __init__(self, ctx):
        import torch
        import torch.distributed as tdist

        self.torch, self.tdist, self.ctx = torch, tdist, ctx
        self.world = tdist.get_world_size() if tdist.is_available() and tdist.is_initialized() else 1
        self.cuda: List[int] = []
        if ctx.device_type == "cuda":
            # every GPU the rank holds, not just the current one: a DataParallel or model-parallel
            # step may still be running on another when the current device is done
            own = [] if ctx.device_index is None else [ctx.device_index]
            self.cuda = sorted(set(own) | set(ctx.devices))

    def sync(self) -> None:
        for i in self.cuda:
            self.torch.cuda.synchronize(i)

    def align(self) -> None:
        if self.world > 1:
            if self.ctx.backend == "nccl" and self.ctx.device_index is not None:
                self.tdist.barrier(device_ids=[self.ctx.device_index])
            else:
                self.tdist.barrier()
        self.sync()

    def time(self, step: Callable[[], Any]) -> float:
        self.align()
        t0 = time.perf_counter()
        step()
        self.sync()
        return time.perf_counter() - t0

    def agree_max(self, value: float) -> float:
        """The largest ``value`` over ranks: every rank takes the same decision from it."""
        if self.world == 1:
            return value
        dev = self.torch.device("cuda", self.ctx.device_index) if self.ctx.backend == "nccl" else "cpu"
        t = self.torch.tensor([value], dtype=self.torch.float64, device=dev)
        self.tdist.all_reduce(t, op=self.tdist.ReduceOp.MAX)
        return float(t.item())


def _calibrated_repeat(estimate: float, min_run_time: float) -> int:
    if estimate <= 0:
        return MAX_REPEAT
    return int(min(MAX_REPEAT, max(MIN_REPEAT, math.ceil(min_run_time / estimate))))


def rank_loop(fn_ref: FnRef, args: tuple, kwargs: dict, loop: LoopConfig) -> RankTiming:
    """Runs in every rank (through ``dist.run``): set up, warm up, time, measure memory."""
    import torch

    from .._context import rank_context

    ctx = rank_context()
    fn = fn_ref.resolve()
    heap = _HeapPeak() if ctx.device_type != "cuda" else None
    if heap is not None and heap.available:
        import gc

        gc.collect()  # a warm rank may still hold garbage of an earlier call
        heap_before = heap.in_use()
    else:
        heap_before = None
    made = fn(*args, **kwargs)
    step = made if callable(made) else functools.partial(fn, *args, **kwargs)
    clock = _Clock(ctx)

    warm: List[float] = []
    if loop.warmup is not None:
        for _ in range(loop.warmup):
            warm.append(clock.time(step))
    else:
        spent = 0.0
        while len(warm) < MAX_WARMUP:
            dt = clock.agree_max(clock.time(step))
            warm.append(dt)
            spent += dt
            if len(warm) >= MIN_WARMUP and (
                abs(warm[-1] - warm[-2]) <= STABLE * min(warm[-1], warm[-2]) or spent >= loop.min_run_time
            ):
                break

    samples: List[float] = []
    repeat = loop.repeat
    if repeat is None and warm:
        estimate = warm[-1] if loop.warmup is None else clock.agree_max(warm[-1])
        repeat = _calibrated_repeat(estimate, loop.min_run_time)

    if ctx.device_type == "cuda":
        for i in clock.cuda:
            torch.cuda.reset_peak_memory_stats(i)
    if repeat is None:  # no warmup to estimate from: the first timed iteration decides
        samples.append(clock.time(step))
        repeat = _calibrated_repeat(clock.agree_max(samples[0]), loop.min_run_time)
    while len(samples) < repeat:
        samples.append(clock.time(step))

    if ctx.device_type == "cuda":
        peak = sum(torch.cuda.max_memory_allocated(i) for i in clock.cuda)
        source = "cuda max_memory_allocated"
    elif heap_before is not None:
        # one more, untimed iteration under the sampler: a sampling thread would disturb the timing
        clock.align()
        peak = max(0, heap.during(step) - heap_before)
        source = "peak C heap in use above the rank's start (one extra iteration)"
    else:
        peak, source = None, "not measured (no mallinfo2 on this platform)"
    devices = [f"cuda:{i}" for i in clock.cuda] or ["cpu"]
    return RankTiming(ctx.rank, samples, warm, devices, peak, source, torch.get_num_threads())


# -- in the test process ----------------------------------------------------------------------------
def _positive_int(name: str, value, allow_zero: bool) -> Optional[int]:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < (0 if allow_zero else 1):
        least = 0 if allow_zero else 1
        raise ValueError(f"dist.benchmark: {name} must be an integer >= {least} (or None to calibrate), "
                         f"got {value!r}")
    return value


def benchmark(
    dist,
    fn,
    *args,
    warmup: Optional[int] = None,
    repeat: Optional[int] = None,
    name: Optional[str] = None,
    batch_size: Optional[int] = None,
    strategy: Optional[str] = None,
    group: Optional[str] = None,
    params: Optional[Dict[str, Any]] = None,
    single_process: bool = False,
    min_run_time: Optional[float] = None,
    timeout: Optional[float] = None,
    **kwargs,
) -> Measurement:
    """Time a training step in every rank of ``dist`` and return a ``Measurement``.

    ``fn(*args, **kwargs)`` runs once in each rank (a module-level function, as for ``dist.run``).
    If it returns a callable, that callable is the step that is timed, and ``fn`` was its setup
    (build the model, optimizer and batch there). Otherwise ``fn`` itself is the step, called with
    the same arguments every iteration (its first call counts as setup).

    warmup, repeat: iteration counts; calibrated when None (warmup until two iterations agree
        within 10%, then enough iterations for ``min_run_time`` seconds, at least 5).
    name: the measurement's name within the test (default: ``strategy`` or the function's name).
    batch_size: samples per step over all ranks together; gives throughput.
    strategy, group, params: how the report labels and compares the row (see ``TaskSpec``); group
        defaults to the test's name, so ``world_sizes(1, 2, 4)`` variants compare with each other.
    single_process: run one process that sees all the test's devices (DataParallel, model
        parallel) instead of one rank per device.
    timeout: seconds for the whole call, as in ``dist.run``.
    """
    __tracebackhide__ = True
    warmup = _positive_int("warmup", warmup, allow_zero=True)
    repeat = _positive_int("repeat", repeat, allow_zero=False)
    batch_size = _positive_int("batch_size", batch_size, allow_zero=False)
    if min_run_time is not None and not min_run_time > 0:
        raise ValueError(f"dist.benchmark: min_run_time must be a positive number of seconds, got {min_run_time!r}")
    ref, _ = pack_call(fn, args, kwargs)  # clear errors for unsendable functions and arguments
    loop = LoopConfig(warmup, repeat, float(min_run_time or DEFAULT_MIN_RUN_TIME))
    if single_process:
        timings = [dist.run_single(rank_loop, ref, args, kwargs, loop, timeout=timeout)]
    else:
        timings = dist.run(rank_loop, ref, args, kwargs, loop, timeout=timeout)

    label = getattr(dist, "label", "dist.benchmark")
    strategy = strategy or name or fn.__name__
    name = name or strategy
    recorded: list = getattr(dist, "measurements", None)
    if recorded is not None:
        taken = {m.task.name for m in recorded}
        base, k = name, 2
        while name in taken:
            name, k = f"{base}#{k}", k + 1
    task = TaskSpec(
        name=name,
        label=label,
        fn=f"{ref.module}:{ref.qualname}",
        strategy=strategy,
        group=group or label.split("[", 1)[0].rsplit("::", 1)[-1],
        world_size=dist.world_size,
        processes=len(timings),
        backend=dist.backend,
        device_type=dist.device_type,
        emulated=dist.emulated,
        batch_size=batch_size,
        params=dict(params or {}),
        warmup=warmup,
        repeat=repeat,
        min_run_time=loop.min_run_time,
    )
    per_iteration = [max(col) for col in zip(*(t.samples for t in timings))]
    m = Measurement(
        task=task,
        samples=per_iteration,
        rank_samples=[t.samples for t in timings],
        warmup=len(timings[0].warmup_samples),
        peak_mem_bytes=[t.peak_mem_bytes for t in timings],
        mem_source=timings[0].mem_source,
    )
    if recorded is not None:
        recorded.append(m)
    return m
