"""The rank side of ``dist.benchmark``: warm up, then time the user's step and the in-run reference
A B A B after each barrier, and measure peak memory. Runs inside every rank through ``dist.run``.

Every rank times its own iterations: a barrier first so that ranks start together, then
``torch.cuda.synchronize`` on every GPU the rank touched before reading the clock at both ends
(``torch.utils.benchmark`` synchronizes only the current device, which under-times model-parallel
steps). Counts are agreed between ranks (an all_reduce of the calibration time), since ranks that
disagree on the number of barriers would hang.
"""
from __future__ import annotations

import functools
import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, List, Optional, Tuple

from ..launch.protocol import FnRef
from .fresh import fresh_function
from .reference import make_reference
from .structure.figures import StepStructure

if TYPE_CHECKING:
    from .structure.counter import StepRecorder

MIN_REPEAT = 5  # fewer cannot reach p < 0.01 in the U test that compare uses between two launches (gate.min_p)
MAX_REPEAT = 500
MIN_WARMUP = 2  # the first iteration is cold (allocator, cudnn autotune, lazy init)
MAX_WARMUP = 20
STABLE = 0.10  # warmup ends when two consecutive iterations agree within 10%
DEFAULT_MIN_RUN_TIME = 1.0  # seconds of timed iterations when `repeat` is not given


@dataclass
class RankTiming:
    """What one rank measured; crosses the process boundary."""

    rank: int
    samples: List[float]
    warmup_samples: List[float]
    peak_mem_bytes: Optional[int]
    mem_source: str
    reference_samples: List[float]  # the reference's time before each step's, same barriers
    structure: List[StepStructure] = field(default_factory=list)  # setup, then the MEM_STEPS steps


@dataclass(frozen=True)
class LoopConfig:
    warmup: Optional[int]
    repeat: Optional[int]
    min_run_time: float
    reference: bool = True  # time the in-run reference before every timed step (A B A B)


def allocation_peak(prof) -> Optional[int]:
    """Peak bytes above the start in torch's CPU allocator while ``prof`` recorded (None: no events).

    Every allocation event carries the allocator's running total (``total_allocated``), so the peak
    is exact and the same for the same code every run: no sampling, no glibc arenas. The total only
    moves with allocations and frees recorded during profiling, so the start is the total before the
    first recorded event."""
    def walk(nodes):
        for n in nodes:
            yield n
            yield from walk(n.children)

    totals = []
    for node in walk(prof.kineto_results.experimental_event_tree()):
        f = node.extra_fields
        if hasattr(f, "total_allocated") and hasattr(f, "alloc_size"):
            totals.append((int(f.total_allocated), int(f.total_allocated) - int(f.alloc_size)))
    if not totals:
        return None
    return max(0, max(t for t, _ in totals) - min(before for _, before in totals))


MEM_STEPS = 2  # profiled steps after setup: the second has the first's optimizer state and gradients


def setup_with_peak(fn, args: tuple, kwargs: dict,
                    recorder: Optional["StepRecorder"] = None) -> Tuple[Callable[[], Any], Optional[int], str]:
    """Set up the step and run it MEM_STEPS times under the torch profiler's memory recording: the peak
    of tensor memory the rank allocated for the model, optimizer state, batch and steps.

    Why not the C heap: the previous figure (glibc ``mallinfo2`` sampled by a thread every 1 ms while
    one extra step ran) read 2 MiB in one run and 27 MiB in the next for the same 1-rank step (issue
    18): the sampler only ran when the step released the GIL, and ``mallinfo2`` counts the main arena
    only. The profiler sees every allocation of torch's CPU allocator with its running total: measured
    on ResNet18 + Adam (batch 8, 32 px), 231.0 MiB in each of 3 runs. Tensors allocated before the setup (module
    globals) are not counted. Where the profiler cannot start (the user's own is on), the same steps
    run unprofiled (ranks must run the same collectives) and memory is reported as not measured.
    ``recorder`` takes the structure of the setup and of each step."""
    from .structure.counter import StepRecorder

    recorder = recorder or StepRecorder()
    prof = _start_profiler()
    try:
        step = recorder.run("setup", lambda: _make_step(fn, args, kwargs))
        for i in range(MEM_STEPS):
            recorder.run(f"step {i}", step)
    finally:
        if prof is not None:
            prof.__exit__(None, None, None)
    if prof is None:
        return step, None, "not measured (the torch profiler could not start: another profiler is on?)"
    peak = allocation_peak(prof)
    if peak is None:
        return step, None, "not measured (no allocation events)"
    return step, peak, f"peak CPU tensor memory from setup through {MEM_STEPS} steps (torch profiler)"


def _start_profiler():
    """torch.autograd.profiler (not torch.profiler: its kineto start took 4.4-7.2 s in a fresh rank on the
    loaded 2-core machine, this one 5 ms), recording every allocation of torch's CPU allocator."""
    import os

    os.environ.setdefault("KINETO_LOG_LEVEL", "6")  # kineto's start/stop lines would fill the rank's log
    try:
        from torch.autograd.profiler import profile

        prof = profile(profile_memory=True)
        prof.__enter__()
        return prof
    except (RuntimeError, ImportError):
        return None


def _make_step(fn, args: tuple, kwargs: dict) -> Callable[[], Any]:
    made = fn(*args, **kwargs)
    return made if callable(made) else functools.partial(fn, *args, **kwargs)


class Clock:
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
            self.cuda = sorted(set(own) | set(ctx.device_indices))
        # where the reference runs: the rank's own device (its first GPU), else the CPU
        self.device = f"cuda:{self.cuda[0] if ctx.device_index is None else ctx.device_index}" if self.cuda else "cpu"

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
        return self.slowest([value])[0]

    def slowest(self, values: List[float]) -> List[float]:
        """Element-wise largest over ranks (one all-reduce): each iteration's slowest rank."""
        if self.world == 1:
            return list(values)
        dev = self.torch.device("cuda", self.ctx.device_index) if self.ctx.backend == "nccl" else "cpu"
        t = self.torch.tensor(values, dtype=self.torch.float64, device=dev)
        self.tdist.all_reduce(t, op=self.tdist.ReduceOp.MAX)
        return [float(v) for v in t.tolist()]


def _calibrated_repeat(estimate: float, min_run_time: float) -> int:
    if estimate <= 0:
        return MAX_REPEAT
    return int(min(MAX_REPEAT, max(MIN_REPEAT, math.ceil(min_run_time / estimate))))


def rank_loop(fn_ref: FnRef, args: tuple, kwargs: dict, loop: LoopConfig) -> RankTiming:
    """Runs in every rank (through ``dist.run``): set up, warm up, time, measure memory. ``fn`` runs
    from a fresh copy of its module (``fresh``), so what earlier calls left in a warm rank's copy
    (a model a step built on its first call) does not change this launch's setup."""
    from .._context import rank_context

    ctx = rank_context()
    clock = Clock(ctx)
    with fresh_function(fn_ref) as fn:  # module state as in a fresh rank: the same setup in every launch
        return _measured(ctx, clock, fn, args, kwargs, loop)


def _measured(ctx, clock: "Clock", fn, args: tuple, kwargs: dict, loop: LoopConfig) -> RankTiming:
    import torch

    step, peak, source, structure = recorded_setup(ctx, clock, fn, args, kwargs)
    warm = warm_up(clock, step, loop)
    repeat = loop.repeat
    if repeat is None and warm:
        estimate = warm[-1] if loop.warmup is None else clock.agree_max(warm[-1])
        repeat = _calibrated_repeat(estimate, loop.min_run_time)
    if ctx.device_type == "cuda":
        for i in clock.cuda:
            torch.cuda.reset_peak_memory_stats(i)
    samples, refs = _timed(clock, step, loop, repeat)
    if ctx.device_type == "cuda":
        peak = sum(torch.cuda.max_memory_allocated(i) for i in clock.cuda)
    return RankTiming(ctx.rank, samples, warm, peak, source, refs, structure)


def recorded_setup(ctx, clock: "Clock", fn, args: tuple,
                   kwargs: dict) -> Tuple[Callable[[], Any], Optional[int], str, List[StepStructure]]:
    """Set the step up and run it MEM_STEPS times, recording the call's structure (the setup and each
    step, the same on every run) and, on CPU ranks, the peak of tensor memory (``setup_with_peak``).
    Returns (step, peak bytes or None, where the peak comes from, structure). On GPUs the peak is
    None here: the caller takes it from CUDA's allocator over the timed iterations."""
    from .structure.counter import StepRecorder

    recorder = StepRecorder(clock.cuda)
    if ctx.device_type == "cuda":
        step = recorder.run("setup", lambda: _make_step(fn, args, kwargs))
        for i in range(MEM_STEPS):
            recorder.run(f"step {i}", step)
        return step, None, "cuda max_memory_allocated", recorder.steps
    step, peak, source = setup_with_peak(fn, args, kwargs, recorder)
    return step, peak, source, recorder.steps


def _timed(clock: "Clock", step: Callable[[], Any], loop: LoopConfig,
           repeat: Optional[int]) -> Tuple[List[float], List[float]]:
    """The step's samples and the in-run reference's, A B A B: ``repeat`` of each (None: as many as
    ``min_run_time`` calls for, estimated from the first timed step)."""
    samples: List[float] = []
    if repeat is None:  # no warmup to estimate from: the first timed iteration decides
        samples.append(clock.time(step))  # (its reference is timed just after it, below)
        repeat = _calibrated_repeat(clock.agree_max(samples[0]), loop.min_run_time)
    reference = make_reference(clock.device) if loop.reference else None
    refs: List[float] = []
    if reference is not None:
        clock.time(reference)  # its first call allocates; then A B A B with the step
        clock.time(reference)
        if samples:
            refs.append(clock.time(reference))
    while len(samples) < repeat:
        if reference is not None:
            refs.append(clock.time(reference))
        samples.append(clock.time(step))
    return samples, refs


def warm_up(clock: "Clock", step: Callable[[], Any], loop: LoopConfig) -> List[float]:
    """Fixed warmup, or until two iterations agree within STABLE (or min_run_time is spent)."""
    warm: List[float] = []
    if loop.warmup is not None:
        for _ in range(loop.warmup):
            warm.append(clock.time(step))
        return warm
    spent = 0.0
    while len(warm) < MAX_WARMUP:
        dt = clock.agree_max(clock.time(step))
        warm.append(dt)
        spent += dt
        if len(warm) >= MIN_WARMUP and (
            abs(warm[-1] - warm[-2]) <= STABLE * min(warm[-1], warm[-2]) or spent >= loop.min_run_time
        ):
            break
    return warm
