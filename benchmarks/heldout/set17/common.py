"""Helpers of the heldout17 families: heldout14's rank queries, seeded generator, autograd all-gather and
global-batch batch norm (``nn.SyncBatchNorm`` refuses CPU tensors), heldout4's torchrun environment, and
a plain (no autograd) all-reduce / all-gather written here.
"""
from __future__ import annotations

import torch
import torch.distributed as tdist

from ..set4.common import torchrun_env
from ..set14.common import SyncBatchNorm1d, all_gather_grad, gen, rank, world

__all__ = ["SyncBatchNorm1d", "all_gather_grad", "all_gather_plain", "all_reduce_sum", "gen", "rank",
           "torchrun_env", "world"]


def all_reduce_sum(t: torch.Tensor) -> torch.Tensor:
    """The sum of ``t`` over the ranks (a new tensor, no autograd)."""
    t = t.detach().clone()
    if world() > 1:
        tdist.all_reduce(t)
    return t


def all_gather_plain(t: torch.Tensor) -> torch.Tensor:
    """The ranks' ``t`` concatenated along dim 0 in rank order, with no autograd (``dist.all_gather``)."""
    if world() == 1:
        return t.detach()
    out = [torch.empty_like(t) for _ in range(world())]
    tdist.all_gather(out, t.detach().contiguous())
    return torch.cat(out, 0)
