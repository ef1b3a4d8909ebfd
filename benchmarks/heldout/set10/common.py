"""Helpers of the heldout10 families: rank queries, a seeded generator, all-reduce and all-gather of plain
tensors (no autograd), a hand all-reduce of parameter gradients (heldout9's), and a broadcast from rank 0.
"""
from __future__ import annotations

import torch
import torch.distributed as tdist

from ..set9.common import all_gather, all_reduce, all_reduce_grads, gen, rank, world

__all__ = ["all_gather", "all_reduce", "all_reduce_grads", "broadcast", "gen", "rank", "world"]


def broadcast(t: torch.Tensor) -> torch.Tensor:
    """Rank 0's ``t`` on every rank (in place; returned)."""
    if world() > 1:
        tdist.broadcast(t, src=0)
    return t
