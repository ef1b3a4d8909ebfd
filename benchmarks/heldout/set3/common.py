"""Helpers of the heldout3 families: those of ``benchmarks/heldout/set1/common.py`` (rank queries, row
blocks) and a seeded generator. All data is made from a seeded ``torch.Generator`` (never the global
RNG), so a rank and the one-device reference build the same global rows for the same step.
"""
from __future__ import annotations

import torch

from ..set1.common import block, rank, world

__all__ = ["block", "gen", "rank", "world"]


def gen(seed: int) -> torch.Generator:
    """A CPU generator seeded with ``seed``."""
    return torch.Generator().manual_seed(seed)
