"""Helpers of the heldout8 families: rank queries, a seeded generator, all-reduce and all-gather of plain
tensors (heldout7's), the autograd ``all_to_all`` of heldout6 (the Ulysses exchange), and a hand
all-reduce of parameter gradients (heldout5's).
"""
from __future__ import annotations

from ..set5.common import all_reduce_grads, gen, rank, world
from ..set6.common import all_to_all
from ..set7.common import all_gather, all_reduce

__all__ = ["all_gather", "all_reduce", "all_reduce_grads", "all_to_all", "gen", "rank", "world"]
