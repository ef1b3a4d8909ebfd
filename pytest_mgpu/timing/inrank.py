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
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Tuple

from ..launch.protocol import FnRef
from .reference import make_reference

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


@dataclass(frozen=True)
class LoopConfig:
    warmup: Optional[int]
    repeat: Optional[int]
    min_run_time: float
    reference: bool = True  # time the in-run reference before every timed step (A B A B)


class HeapPeak:
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
    heap = HeapPeak() if ctx.device_type != "cuda" else None
    if heap is not None and heap.available:
        import gc

        gc.collect()  # a warm rank may still hold garbage of an earlier call
        heap_before = heap.in_use()
    else:
        heap_before = None
    made = fn(*args, **kwargs)
    step = made if callable(made) else functools.partial(fn, *args, **kwargs)
    clock = Clock(ctx)
    warm = _warm_up(clock, step, loop)
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
        source = "cuda max_memory_allocated"
    elif heap_before is not None:
        # one more, untimed iteration under the sampler: a sampling thread would disturb the timing
        clock.align()
        peak = max(0, heap.during(step) - heap_before)
        source = "peak C heap in use above the rank's start (one extra iteration)"
    else:
        peak, source = None, "not measured (no mallinfo2 on this platform)"
    return RankTiming(ctx.rank, samples, warm, peak, source, refs)


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


def _warm_up(clock: "Clock", step: Callable[[], Any], loop: LoopConfig) -> List[float]:
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
