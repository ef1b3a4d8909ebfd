"""Helpers of the heldout19 families: heldout18's (heldout17's rank queries, seeded generator, autograd
all-gather, global-batch batch norm, heldout4's torchrun environment, plain all-reduce / all-gather;
heldout14's autograd all-reduce), and written here a dropout whose keep-mask is set from outside (the
rank's rows of a global draw) and a global-batch batch norm that computes in float32 under autocast.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..set18.common import (SyncBatchNorm1d, all_gather_grad, all_gather_plain, all_reduce_grad, all_reduce_sum, gen,
                            rank, torchrun_env, world)

__all__ = ["Float32SyncBatchNorm1d", "MaskDropout", "SyncBatchNorm1d", "all_gather_grad", "all_gather_plain",
           "all_reduce_grad", "all_reduce_sum", "gen", "rank", "torchrun_env", "world"]


class MaskDropout(nn.Module):
    """Dropout with probability ``p`` whose keep-mask is set from outside (``.mask``: the rank's rows of a
    global per-step draw); with no mask set, ordinary ``F.dropout`` from the global RNG; identity in eval."""

    def __init__(self, p: float):
        super().__init__()
        self.p, self.mask = p, None

    def forward(self, x):
        if not self.training:
            return x
        if self.mask is None:
            return F.dropout(x, self.p, True)
        return x * self.mask.to(x.dtype) / (1 - self.p)


class Float32SyncBatchNorm1d(SyncBatchNorm1d):
    """heldout14's global-batch batch norm on the float32 upcast of its input (as cuDNN's batch norm keeps
    its statistics in float32 under float16 autocast); returns float32."""

    def forward(self, x):
        return super().forward(x.float())
