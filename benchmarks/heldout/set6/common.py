"""Helpers of the heldout6 families: rank queries, a seeded generator, the torchrun environment (as
heldout4's, for the libraries), and an ``all_to_all_single`` that autograd can pass through (the
token exchange of an expert-parallel layer: its backward is the same exchange in reverse).
"""
from __future__ import annotations

import torch
import torch.distributed as tdist

from ..set4.common import torchrun_env
from ..set5.common import copy_to, gen, rank, reduce_from, world

__all__ = ["all_to_all", "copy_to", "gen", "rank", "reduce_from", "torchrun_env", "world"]


class _AllToAll(torch.autograd.Function):
    """Equal splits along dim 0 exchanged with every rank; the backward sends the gradients back."""

    @staticmethod
    def forward(ctx, x):
        if world() == 1:
            return x.clone()
        out = torch.empty_like(x)
        tdist.all_to_all_single(out, x.contiguous())
        return out

    @staticmethod
    def backward(ctx, g):
        return _AllToAll.apply(g.contiguous())


def all_to_all(x: torch.Tensor) -> torch.Tensor:
    """Chunk ``i`` of ``x`` (dim 0 split into ``world()`` equal chunks) goes to rank ``i``; the result's
    chunk ``j`` came from rank ``j``."""
    return _AllToAll.apply(x)
