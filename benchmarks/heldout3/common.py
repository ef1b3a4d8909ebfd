"""Helpers shared by the heldout3 families: rank queries, seeded synthetic data, row blocks.

All data is made from a seeded ``torch.Generator`` (never the global RNG), so a rank and the
one-device reference build the same global rows for the same step.
"""
from __future__ import annotations

import torch
import torch.distributed as tdist


def rank() -> int:
    """This process's rank in the default group (0 where no group is up)."""
    return tdist.get_rank() if tdist.is_initialized() else 0


def world() -> int:
    """The default group's size (1 where no group is up)."""
    return tdist.get_world_size() if tdist.is_initialized() else 1


def gen(seed: int) -> torch.Generator:
    """A CPU generator seeded with ``seed``."""
    return torch.Generator().manual_seed(seed)


def block(t: torch.Tensor, r: int, w: int) -> torch.Tensor:
    """Rank ``r``'s consecutive block of the global rows ``t``."""
    return t.chunk(w)[r]
