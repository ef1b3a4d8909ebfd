"""Inside a real rank: count the collectives a piece of work issues, and the bytes this rank sends.

A pass-through ``TorchDispatchMode`` sees every c10d op, whichever layer issued it: DDP's reducer
(``c10d.allreduce_`` from C++, in backward), FSDP2 (``c10d._allgather_base_``,
``c10d._reduce_scatter_base_``), DTensor's functional collectives and pipeline send/recv; the names
and bytes are the simulated tier's (``simulate.wire``), so both tiers read the same. It is on only
for the setup and the first steps of ``dist.benchmark`` (``StepRecorder``), never while timing.
Work of our own that runs while a counter is on (the gathers that record a user's loop for
``assert_same_training``) runs under ``quiet()``: every counter on in the process is paused, not
popped (a mode cannot leave the stack while another mode sits above it).

Peak memory is taken only on GPUs, from CUDA's caching allocator: the most a piece of work held at once
above what was allocated when it began (``max_memory_allocated`` after a reset, less
``memory_allocated`` then, summed over the rank's GPUs), so that tensors an earlier test left alive in a
warm rank do not count. cuBLAS takes its workspace (64 MiB on an H200) from that allocator at a
process's first matrix product and keeps it: it is taken before the first piece, so that whether a test
ran first in its rank does not move its step 0 by that much. Real CPU ranks leave the peak out.
"""
from __future__ import annotations

import contextlib
from collections import Counter
from typing import Any, Callable, Iterator, List, Sequence

from .figures import StepStructure


def _dispatch_mode():
    from torch.utils._python_dispatch import TorchDispatchMode

    return TorchDispatchMode


_ON: List["CollectiveCounter"] = []  # the counters entered and not yet left, in this process


class CollectiveCounter(_dispatch_mode()):  # type: ignore[misc]
    """``with CollectiveCounter() as c: work()``; then ``c.counts`` and ``c.sent`` by op name.
    ``paused``: ops still pass through, uncounted (``quiet()``)."""

    paused = False

    def __init__(self):
        super().__init__()
        from torch.distributed.tensor import DTensor

        from ...simulate.wire import collective_ops, sent_bytes

        self._dtensor, self._sent_bytes = DTensor, sent_bytes
        self._ops = collective_ops()
        self.counts: Counter = Counter()
        self.sent: Counter = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if self._dtensor in types:
            return NotImplemented  # DTensor turns into local ops (and collectives) first
        out = func(*args, **(kwargs or {}))
        wire = self._ops.get(getattr(func, "_overloadpacket", None))
        if wire is not None and not self.paused:
            self.counts[wire.name] += 1
            self.sent[wire.name] += self._sent_bytes(wire, args)
        return out

    def __enter__(self):
        _ON.append(self)
        return super().__enter__()

    def __exit__(self, *exc):
        _ON.remove(self)
        return super().__exit__(*exc)


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Our own work inside counted work: every counter on in this process counts nothing meanwhile."""
    held = [c for c in _ON if not c.paused]
    for c in held:
        c.paused = True
    try:
        yield
    finally:
        for c in held:
            c.paused = False


class StepRecorder:
    """Runs named pieces of work (the setup, then steps) under a ``CollectiveCounter`` each, and keeps
    one ``StepStructure`` per piece; ``cuda``: the GPU indices whose peak memory is taken."""

    def __init__(self, cuda: Sequence[int] = ()):
        self.cuda = list(cuda)
        self.steps: List[StepStructure] = []

    def run(self, name: str, work: Callable[[], Any]) -> Any:
        import torch

        if not self.steps:
            for i in self.cuda:
                warm_cublas(i)
        for i in self.cuda:
            torch.cuda.synchronize(i)
            torch.cuda.reset_peak_memory_stats(i)
        held = sum(int(torch.cuda.memory_allocated(i)) for i in self.cuda)
        with CollectiveCounter() as counter:
            out = work()
        peak = None
        if self.cuda:
            for i in self.cuda:
                torch.cuda.synchronize(i)
            peak = sum(int(torch.cuda.max_memory_allocated(i)) for i in self.cuda) - held
        self.steps.append(StepStructure(name, dict(counter.counts), dict(counter.sent), peak))
        return out


def warm_cublas(index: int) -> None:
    """One small matrix product on GPU ``index``: cuBLAS allocates its workspace now, not inside the
    first measured piece (measured on an H200: step 0 of a fresh process read 64 MiB more than the same
    step in a rank that had multiplied before)."""
    import torch

    with torch.cuda.device(index):
        a = torch.ones(8, 8, device=f"cuda:{index}")
        (a @ a).sum().item()
