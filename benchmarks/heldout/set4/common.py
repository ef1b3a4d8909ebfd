"""Helpers of the heldout4 families: rank queries, a seeded generator, the torchrun environment.

All data is made from a seeded ``torch.Generator`` (never the global RNG), so a rank and the
one-device reference build the same global rows. The libraries (Lightning, accelerate,
transformers) read the torchrun variables to learn their rank; :func:`torchrun_env` sets them from
the process group that is already up, as ``torchrun`` would have set them.
"""
from __future__ import annotations

import os

import torch
import torch.distributed as tdist

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def rank() -> int:
    """This process's rank in the default group (0 where no group is up)."""
    return tdist.get_rank() if tdist.is_initialized() else 0


def world() -> int:
    """The default group's size (1 where no group is up)."""
    return tdist.get_world_size() if tdist.is_initialized() else 1


def gen(seed: int) -> torch.Generator:
    """A CPU generator seeded with ``seed``."""
    return torch.Generator().manual_seed(seed)


def torchrun_env() -> None:
    """Set RANK, LOCAL_RANK, WORLD_SIZE (and a master address) from the group that is up, as torchrun
    sets them for a one-node job; the libraries then join that group instead of starting their own."""
    os.environ.update(RANK=str(rank()), LOCAL_RANK=str(rank()), WORLD_SIZE=str(world()),
                      LOCAL_WORLD_SIZE=str(world()), GROUP_RANK="0", NODE_RANK="0")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")


def images(seed: int, n: int, size: int, classes: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``n`` RGB images ``size`` x ``size`` and integer labels in ``[0, classes)``, from ``seed``."""
    g = gen(seed)
    return torch.randn(n, 3, size, size, generator=g), torch.randint(0, classes, (n,), generator=g)


def tokens(seed: int, n: int, length: int, vocab: int) -> torch.Tensor:
    """``n`` rows of ``length`` token ids in ``[0, vocab)``, from ``seed``."""
    return torch.randint(0, vocab, (n, length), generator=gen(seed))
