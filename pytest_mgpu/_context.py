"""What a rank knows about itself while the user's function runs.

Set once by the rank bootstrap (``launch/rank.py``) before the user's code runs; read through
``rank_device()`` and ``rank_context()``. Kept free of torch imports at module level so that
``import pytest_mgpu`` stays cheap in the pytest process.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Tuple


@dataclass(frozen=True)
class RankContext:
    """The identity of the current rank, as the launcher set it up."""

    rank: int
    world_size: int
    local_rank: int
    device_type: str  # "cuda" or "cpu"
    device_index: Optional[int]  # this rank's own GPU (index among visible devices); None on cpu
    backend: str
    emulated: bool
    seed: int
    devices: Tuple[int, ...] = ()  # every visible device index this rank may use (model parallel)

    def device(self):
        import torch

        if self.device_type == "cuda":
            return torch.device("cuda", self.device_index)
        return torch.device("cpu")


_current: Optional[RankContext] = None


def set_rank_context(ctx: Optional[RankContext]) -> None:
    global _current
    _current = ctx


def rank_context() -> RankContext:
    """The current rank's context; raises outside a rank started by pytest-mgpu."""
    if _current is None:
        raise RuntimeError(
            "rank_context()/rank_device() only work inside a function run by dist.run() (or "
            "pytest_mgpu.simulate()); call them from the function you pass to it, not from the test body"
        )
    return _current


def rank_device():
    """This rank's ``torch.device``: its own GPU (``cuda:i``) or ``cpu`` when emulated."""
    return rank_context().device()


def in_rank() -> bool:
    return _current is not None
