"""Helpers of the heldout13 families: rank queries, a seeded generator, all-reduce and all-gather of plain
tensors (heldout7's; no autograd).
"""
from __future__ import annotations

from ..set7.common import all_gather, all_reduce, gen, rank, world

__all__ = ["all_gather", "all_reduce", "gen", "rank", "world"]
