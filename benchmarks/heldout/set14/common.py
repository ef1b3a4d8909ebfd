"""Helpers of the heldout14 families: rank queries, a seeded generator, all-reduce and all-gather of plain
tensors (heldout7's; no autograd), their autograd forms (``torch.distributed.nn.functional``: the backward
of a gather or a sum all-reduces the gradients), and a batch norm whose statistics are those of the
global batch (``nn.SyncBatchNorm`` refuses CPU tensors, so the CPU ranks use this one, written after
``torch/nn/modules/_functions.py`` ``SyncBatchNorm``: sums and sums of squares all-reduced).
"""
from __future__ import annotations

import warnings

import torch
import torch.distributed.nn.functional as dnf
from torch import nn

from ..set7.common import all_gather, all_reduce, gen, rank, world

warnings.filterwarnings("ignore", message="torch.distributed.nn.functional", category=FutureWarning)

__all__ = ["SyncBatchNorm1d", "all_gather", "all_gather_grad", "all_reduce", "all_reduce_grad", "gen", "rank",
           "world"]


def all_gather_grad(t: torch.Tensor) -> torch.Tensor:
    """The ranks' ``t`` concatenated along dim 0 in rank order; the backward sums every rank's gradient
    for this rank's rows."""
    return torch.cat(dnf.all_gather(t), 0) if world() > 1 else t


def all_reduce_grad(t: torch.Tensor) -> torch.Tensor:
    """The sum of ``t`` over the ranks; the backward sums the ranks' gradients."""
    return dnf.all_reduce(t) if world() > 1 else t


class SyncBatchNorm1d(nn.Module):
    """BatchNorm1d over the global batch: mean and biased variance from all-reduced sums (the unbiased
    variance in the running estimate), as ``nn.SyncBatchNorm`` computes them on GPUs."""

    def __init__(self, n: int, affine: bool = True, eps: float = 1e-5, momentum: float = 0.1):
        super().__init__()
        self.eps, self.momentum = eps, momentum
        self.weight = nn.Parameter(torch.ones(n)) if affine else None
        self.bias = nn.Parameter(torch.zeros(n)) if affine else None
        self.register_buffer("running_mean", torch.zeros(n))
        self.register_buffer("running_var", torch.ones(n))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            mean, var = self.running_mean, self.running_var
        else:
            count = torch.full((1,), float(x.shape[0]))
            stats = all_reduce_grad(torch.cat([x.sum(0), (x * x).sum(0), count]))
            n = stats[-1].detach()
            mean = stats[:x.shape[1]] / n
            var = stats[x.shape[1]:-1] / n - mean * mean
            with torch.no_grad():
                self.running_mean.mul_(1 - self.momentum).add_(self.momentum * mean)
                self.running_var.mul_(1 - self.momentum).add_(self.momentum * var * n / (n - 1))
        y = (x - mean) / torch.sqrt(var + self.eps)
        return y * self.weight + self.bias if self.weight is not None else y
