"""Helpers of the heldout7 families: rank queries, a seeded generator, all-reduce and all-gather of plain
tensors, the autograd ``all_to_all`` of heldout6, and a ring pass that autograd can go through (the
K/V hand-off of ring attention: forward sends to the next rank and receives from the previous one,
backward sends the gradient back the other way).
"""
from __future__ import annotations

import torch
import torch.distributed as tdist

from ..set5.common import gen, rank, world
from ..set6.common import all_to_all

__all__ = ["all_gather", "all_reduce", "all_to_all", "gen", "rank", "ring_pass", "world"]


def all_reduce(t: torch.Tensor) -> torch.Tensor:
    """The sum of ``t`` over the default group (a new tensor; no autograd)."""
    t = t.detach().clone()
    if world() > 1:
        tdist.all_reduce(t)
    return t


def all_gather(t: torch.Tensor) -> torch.Tensor:
    """The ranks' ``t`` concatenated along dim 0 in rank order (no autograd)."""
    if world() == 1:
        return t.detach().clone()
    parts = [torch.empty_like(t) for _ in range(world())]
    tdist.all_gather(parts, t.detach().contiguous())
    return torch.cat(parts, 0)


def _shift(x: torch.Tensor, step: int) -> torch.Tensor:
    """Send ``x`` to rank ``r + step``, receive from rank ``r - step`` (mod W)."""
    r, w = rank(), world()
    x = x.contiguous()
    out = torch.empty_like(x)
    ops = [tdist.P2POp(tdist.isend, x, (r + step) % w),
           tdist.P2POp(tdist.irecv, out, (r - step) % w)]
    for req in tdist.batch_isend_irecv(ops):
        req.wait()
    return out


class _RingPass(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return _shift(x, 1)

    @staticmethod
    def backward(ctx, g):
        return _shift(g.contiguous(), -1)


def ring_pass(x: torch.Tensor, grad: bool = True) -> torch.Tensor:
    """``x`` handed to the next rank in the ring; the result is the previous rank's ``x``. ``grad=False``:
    a plain send/recv (the gradient does not travel back)."""
    if world() == 1:
        return x
    return _RingPass.apply(x) if grad else _shift(x.detach(), 1)
