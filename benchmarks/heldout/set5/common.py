"""Helpers of the heldout5 families: rank queries, row blocks, a seeded generator (as heldout3's), and
Megatron-LM's tensor-parallel region mappings written by hand (``megatron/core/tensor_parallel/
mappings.py``: ``_CopyToModelParallelRegion``, ``_ReduceFromModelParallelRegion``,
``_GatherFromSequenceParallelRegion``, ``_ReduceScatterToSequenceParallelRegion``), each an
``autograd.Function`` over the default group. All data is made from a seeded ``torch.Generator``.
"""
from __future__ import annotations

import torch
import torch.distributed as tdist

from ..set1.common import block, rank, world

__all__ = ["block", "gen", "rank", "world", "copy_to", "reduce_from", "gather_seq", "reduce_scatter_seq",
           "all_reduce_grads"]


def gen(seed: int) -> torch.Generator:
    """A CPU generator seeded with ``seed``."""
    return torch.Generator().manual_seed(seed)


def _all_reduce(t: torch.Tensor) -> torch.Tensor:
    t = t.clone()
    if world() > 1:
        tdist.all_reduce(t)
    return t


def _all_gather(t: torch.Tensor, dim: int = 0) -> torch.Tensor:
    if world() == 1:
        return t
    parts = [torch.empty_like(t) for _ in range(world())]
    tdist.all_gather(parts, t.contiguous())
    return torch.cat(parts, dim)


class _Copy(torch.autograd.Function):
    """Identity forward, all-reduce backward (f in Megatron's paper). ``reduce_bwd=False``: the bug
    where the backward all-reduce is left out."""

    @staticmethod
    def forward(ctx, x, reduce_bwd):
        ctx.reduce_bwd = reduce_bwd
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return (_all_reduce(g) if ctx.reduce_bwd else g), None


class _Reduce(torch.autograd.Function):
    """All-reduce forward, identity backward (g in Megatron's paper). ``reduce_bwd=True``: the bug
    where the backward all-reduces as well."""

    @staticmethod
    def forward(ctx, x, reduce_bwd):
        ctx.reduce_bwd = reduce_bwd
        return _all_reduce(x)

    @staticmethod
    def backward(ctx, g):
        return (_all_reduce(g) if ctx.reduce_bwd else g), None


class _GatherSeq(torch.autograd.Function):
    """All-gather along dim 0 (the sequence) forward, reduce-scatter backward."""

    @staticmethod
    def forward(ctx, x):
        return _all_gather(x, 0)

    @staticmethod
    def backward(ctx, g):
        return _all_reduce(g).chunk(world(), 0)[rank()].contiguous()


class _ReduceScatterSeq(torch.autograd.Function):
    """Reduce-scatter along dim 0 forward (summed, this rank's block kept), all-gather backward."""

    @staticmethod
    def forward(ctx, x):
        return _all_reduce(x).chunk(world(), 0)[rank()].contiguous()

    @staticmethod
    def backward(ctx, g):
        return _all_gather(g, 0)


def copy_to(x: torch.Tensor, reduce_bwd: bool = True) -> torch.Tensor:
    return _Copy.apply(x, reduce_bwd)


def reduce_from(x: torch.Tensor, reduce_bwd: bool = False) -> torch.Tensor:
    return _Reduce.apply(x, reduce_bwd)


def gather_seq(x: torch.Tensor) -> torch.Tensor:
    return _GatherSeq.apply(x)


def reduce_scatter_seq(x: torch.Tensor) -> torch.Tensor:
    return _ReduceScatterSeq.apply(x)


def all_reduce_grads(params, divide: int = 1) -> None:
    """Sum each parameter's gradient over the default group, then divide it by ``divide``."""
    for p in params:
        if p.grad is not None and world() > 1:
            tdist.all_reduce(p.grad)
            if divide != 1:
                p.grad.div_(divide)
