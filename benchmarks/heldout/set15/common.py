"""Helpers of the heldout15 families: rank queries, a seeded generator, all-reduce / all-gather of plain
tensors (heldout7's), the autograd ``all_to_all`` of heldout6 (equal chunks; the backward sends the
gradients back), the torchrun environment the libraries read (heldout4's) and heldout14's batch norm
over the global batch (``nn.SyncBatchNorm`` refuses CPU tensors).
"""
from __future__ import annotations

from ..set4.common import torchrun_env
from ..set6.common import all_to_all
from ..set14.common import SyncBatchNorm1d, all_gather, all_reduce, gen, rank, world

__all__ = ["SyncBatchNorm1d", "all_gather", "all_reduce", "all_to_all", "gen", "rank", "torchrun_env", "world"]
