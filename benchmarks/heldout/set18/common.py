"""Helpers of the heldout18 families: heldout17's (heldout14's rank queries, seeded generator, autograd
all-gather and global-batch batch norm; heldout4's torchrun environment; plain all-reduce / all-gather)
and heldout14's autograd all-reduce.
"""
from __future__ import annotations

from ..set14.common import all_reduce_grad
from ..set17.common import (SyncBatchNorm1d, all_gather_grad, all_gather_plain, all_reduce_sum, gen, rank,
                            torchrun_env, world)

__all__ = ["SyncBatchNorm1d", "all_gather_grad", "all_gather_plain", "all_reduce_grad", "all_reduce_sum", "gen",
           "rank", "torchrun_env", "world"]
