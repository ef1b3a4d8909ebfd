"""Helpers shared by the held-out families: rank queries, seeded synthetic data, row sharding.

All data is made from a seeded ``torch.Generator`` (never the global RNG), so a rank and the
one-device reference build the same global rows for the same step.
"""
from __future__ import annotations

import torch
import torch.distributed as tdist
from torch.utils.data import TensorDataset


def rank() -> int:
    """This process's rank in the default group (0 where no group is up)."""
    return tdist.get_rank() if tdist.is_initialized() else 0


def world() -> int:
    """The default group's size (1 where no group is up)."""
    return tdist.get_world_size() if tdist.is_initialized() else 1


def classify_rows(seed: int, n: int, dim: int, classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` rows of ``dim`` features and integer labels in ``[0, classes)``, from ``seed``."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, dim, generator=g), torch.randint(0, classes, (n,), generator=g)


def regress_rows(seed: int, n: int, dim: int, out: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` rows of ``dim`` features and ``out`` regression targets, from ``seed``."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, dim, generator=g), torch.randn(n, out, generator=g)


def classify_table(seed: int, n: int, dim: int, classes: int) -> TensorDataset:
    """A ``TensorDataset`` of :func:`classify_rows` (for samplers and loaders)."""
    return TensorDataset(*classify_rows(seed, n, dim, classes))


def block(t: torch.Tensor, r: int, w: int) -> torch.Tensor:
    """Rank ``r``'s consecutive block of the global rows ``t`` (as a DistributedSampler without
    shuffle would give them, up to order)."""
    return t.chunk(w)[r]


def reseed_apart() -> None:
    """What "seed + rank" at the top of a script does: the global RNG reseeded per rank (rank 0
    keeps the seed it had, so rank 0 still matches the reference)."""
    torch.manual_seed(torch.initial_seed() + rank())
