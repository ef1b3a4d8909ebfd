"""Helpers of the heldout9 families: rank queries, a seeded generator, all-reduce and all-gather of plain
tensors (heldout7's), a hand all-reduce of parameter gradients (heldout5's), and an all-gather that
autograd goes through (SimCLR's ``GatherLayer``: forward all-gathers, backward all-reduces the gathered
gradient and keeps this rank's slice; ``reduce_bwd=False`` keeps the rank's slice without the
all-reduce, as an early public version did).
"""
from __future__ import annotations

import torch
import torch.distributed as tdist

from ..set8.common import all_gather, all_reduce, all_reduce_grads, gen, rank, world

__all__ = ["all_gather", "all_reduce", "all_reduce_grads", "gather_grad", "gen", "rank", "world"]


class _GatherLayer(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, reduce_bwd):
        ctx.reduce_bwd = reduce_bwd
        parts = [torch.empty_like(x) for _ in range(world())]
        tdist.all_gather(parts, x.contiguous())
        return torch.cat(parts, 0)

    @staticmethod
    def backward(ctx, g):
        g = g.contiguous().clone()
        if ctx.reduce_bwd:
            tdist.all_reduce(g)
        return g.chunk(world(), 0)[rank()], None


def gather_grad(x: torch.Tensor, reduce_bwd: bool = True) -> torch.Tensor:
    """The ranks' ``x`` concatenated along dim 0 in rank order, gradients flowing back to every rank."""
    if world() == 1:
        return x
    return _GatherLayer.apply(x, reduce_bwd)
