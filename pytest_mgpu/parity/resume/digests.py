"""Whether this run reproduces itself: a digest of every rank's own parameters after each optimizer
step that trains, taken alike in the uninterrupted and the interrupted phase.

The interrupted phase repeats the uninterrupted run's first K steps from scratch. Where each rank's
parameters after each of those steps are bit for bit the uninterrupted run's (the same digests),
this trainer on these kernels is reproducible, and at up to ``EXACT_SUMS`` ranks a correct resume is
bitwise equal too: then any difference after the resume is a bug, however small (``verdict.py``).
Where they differ (another world size; non-deterministic kernels; more ranks), the measured line
judges. A digest hashes this rank's local
tensors (a DTensor's shard): no collective, no copy to full size.
"""
from __future__ import annotations

import contextlib
import hashlib
from typing import Iterator, List

from ..record.step_recorder import step_hooks

# Up to this many ranks every reduction adds two numbers at most, which commutes exactly, so a
# restarted run sums as the uninterrupted one did. With more, where a value sits in a bucket decides
# the order a ring adds the ranks' values in, and DDP lays its buckets out anew in a restarted
# process: a correct resume of the DDP tutorial's trainer at 4 ranks differed by 1.5e-8 at its first
# resumed step though its first steps had reproduced. There the measured line judges.
EXACT_SUMS = 2


class Digests:
    """Optimizer step hooks: after each outermost step that could train (some lr above 0, some
    gradient nonzero: the steps ``StopBefore`` counts), one digest of the parameters it stepped."""

    def __init__(self, on: bool = True) -> None:
        self.digests: List[str] = []
        self._depth = 0
        self.on = on  # off where no verdict reads them (another world size, more than EXACT_SUMS ranks)

    @contextlib.contextmanager
    def installed(self) -> Iterator["Digests"]:
        with step_hooks(self._pre, self._post) if self.on else contextlib.nullcontext():
            yield self

    def _pre(self, optimizer, args, kwargs) -> None:
        self._depth += 1

    def _post(self, optimizer, args, kwargs) -> None:
        self._depth -= 1
        if self._depth == 0 and could_train(optimizer):
            self.digests.append(digest(optimizer))


def could_train(optimizer) -> bool:
    """Some learning rate above 0 and some gradient nonzero: a step that can change the model."""
    lrs = [float(g["lr"]) for g in optimizer.param_groups if "lr" in g]
    if lrs and not any(lrs):
        return False
    grads = [p.grad for g in optimizer.param_groups for p in g["params"] if p.grad is not None]
    return not grads or any(bool((g.to_local() if hasattr(g, "to_local") else g).any()) for g in grads)


def digest(optimizer) -> str:
    """A hash of the bytes of every parameter this rank holds of ``optimizer``'s groups, in order."""
    import torch

    h = hashlib.blake2b(digest_size=16)
    for group in optimizer.param_groups:
        for p in group["params"]:
            t = p.detach()
            t = t.to_local() if hasattr(t, "to_local") else t
            h.update(str(tuple(t.shape)).encode())
            h.update(raw_bytes(t))
    return h.hexdigest()


def raw_bytes(t) -> bytes:
    """The bytes of ``t``'s elements, read without numpy (torch's wheel does not install it, and
    ``Tensor.numpy()`` raises "Numpy is not available" where it is missing)."""
    import ctypes

    t = t.detach().cpu().contiguous()
    return ctypes.string_at(t.data_ptr(), t.numel() * t.element_size()) if t.numel() else b""


def reproduced(uninterrupted: List[List[str]], interrupted: List[List[str]], steps: int) -> bool:
    """Every rank's first ``steps`` digests equal in both phases (same ranks, nothing missing)."""
    return (len(uninterrupted) == len(interrupted) > 0
            and all(len(u) >= steps and len(i) >= steps and u[:steps] == i[:steps]
                    for u, i in zip(uninterrupted, interrupted)))
