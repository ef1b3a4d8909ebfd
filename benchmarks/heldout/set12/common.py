"""Helpers of the heldout12 families: rank queries, a seeded generator, all-reduce and all-gather of plain
tensors (heldout9's), and, for the 2-D parallel family, Megatron-style process groups built with
``dist.new_group`` (tensor-parallel groups of consecutive ranks, data-parallel groups across them) and
the tensor-parallel region mappings over a given group (``copy_to``: identity forward, all-reduce
backward; ``reduce_from``: all-reduce forward, identity backward).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as tdist

from ..set9.common import all_gather, all_reduce, gen, rank, world

__all__ = ["Grid", "all_gather", "all_reduce", "copy_to", "gen", "grid", "rank", "reduce_from", "world"]


@dataclass
class Grid:
    """This rank's place in a TP x DP grid: its groups (``None`` at one process) and coordinates."""
    tp: int
    dp: int
    tp_rank: int
    dp_rank: int
    tp_group: object
    dp_group: object


def grid(tp: int) -> Grid:
    """Megatron's layout: TP groups ``[0..tp-1], [tp..2tp-1], ...``, DP groups ``[i, i+tp, ...]``.
    Every rank creates every group, in the same order, as ``new_group`` requires."""
    w, r = world(), rank()
    if w == 1:
        return Grid(1, 1, 0, 0, None, None)
    tp = min(tp, w)
    dp = w // tp
    tp_group = dp_group = None
    for i in range(dp):
        g = tdist.new_group(list(range(i * tp, (i + 1) * tp)))
        if r // tp == i:
            tp_group = g
    for j in range(tp):
        g = tdist.new_group(list(range(j, w, tp)))
        if r % tp == j:
            dp_group = g
    return Grid(tp, dp, r % tp, r // tp, tp_group, dp_group)


def _reduce(t: torch.Tensor, group) -> torch.Tensor:
    t = t.clone()
    if group is not None and tdist.get_world_size(group) > 1:
        tdist.all_reduce(t, group=group)
    return t


class _Copy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, reduce_bwd):
        ctx.group, ctx.reduce_bwd = group, reduce_bwd
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return (_reduce(g, ctx.group) if ctx.reduce_bwd else g), None, None


class _Reduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group):
        return _reduce(x, group)

    @staticmethod
    def backward(ctx, g):
        return g, None


def copy_to(x: torch.Tensor, group, reduce_bwd: bool = True) -> torch.Tensor:
    """Enter a tensor-parallel region: identity forward, the gradient all-reduced over ``group``."""
    return _Copy.apply(x, group, reduce_bwd)


def reduce_from(x: torch.Tensor, group) -> torch.Tensor:
    """Leave a row-parallel region: the partial outputs summed over ``group``; identity backward."""
    return _Reduce.apply(x, group)
