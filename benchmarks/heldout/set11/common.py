"""Helpers of the heldout10 families: rank queries, a seeded generator, all-reduce and all-gather of plain
tensors (heldout7's, as heldout9 re-exports them).
"""
from __future__ import annotations

from ..set9.common import all_gather, all_reduce, gen, rank, world

__all__ = ["all_gather", "all_reduce", "gen", "rank", "world"]
