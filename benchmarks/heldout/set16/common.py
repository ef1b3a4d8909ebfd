"""Helpers of the heldout16 families (set15's: rank queries, a seeded generator, all-reduce / all-gather of
plain tensors, the autograd ``all_to_all`` of heldout6, the torchrun environment the libraries read).
"""
from __future__ import annotations

from ..set15.common import all_gather, all_reduce, all_to_all, gen, rank, torchrun_env, world

__all__ = ["all_gather", "all_reduce", "all_to_all", "gen", "rank", "torchrun_env", "world"]
