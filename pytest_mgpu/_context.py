"""What a rank knows about itself while the user's function runs.

Set once by the rank bootstrap (``launch/rank.py``) before the user's code runs; read through
``rank_device()`` and ``rank_context()``. Kept free of torch imports at module level so that
``import pytest_mgpu`` stays cheap in the pytest process.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional, Sequence, Tuple


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
    # The torch.device of every device this process may use (model parallel, DataParallel): its
    # cuda:i on GPUs; on emulated ranks ``cpu`` once per device of the test it stands in for, so code
    # written for N devices (``devs[0]``, ``devs[-1]``, ``len(devs)``) runs unchanged on the CPU.
    devices: Tuple[Any, ...] = ()

    @property
    def device_indices(self) -> Tuple[int, ...]:
        """The CUDA indices of ``devices`` (empty on CPU ranks)."""
        return tuple(d.index for d in self.devices if d.type == "cuda")

    def device(self):
        import torch

        if self.device_type == "cuda":
            # torch accepts index None (the current device) at runtime; its stub says int
            return torch.device("cuda", self.device_index)  # type: ignore[arg-type]
        return torch.device("cpu")


def torch_devices(device_type: str, indices: Sequence[int]) -> Tuple[Any, ...]:
    """``RankContext.devices`` from the launcher's device indices (on CPU: one ``cpu`` per index)."""
    import torch

    if device_type == "cuda":
        return tuple(torch.device("cuda", i) for i in indices)
    return tuple(torch.device("cpu") for _ in indices)


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
