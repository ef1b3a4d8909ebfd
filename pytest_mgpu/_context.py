"""What a rank knows about itself while the user's function runs.

Set once by the rank bootstrap (``launch/rank.py``) before the user's code runs; read through
``rank_device()`` and ``rank_context()``. Kept free of torch imports at module level so that
``import pytest_mgpu`` stays cheap in the pytest process.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional, Sequence, Tuple

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class RankContext:
    """The identity of the current rank, as the launcher set it up (``pytest_mgpu.rank_context()``).

    Attributes:
        rank: This rank's number in the default group.
        world_size: Ranks in the default group.
        local_rank: This rank's number on its machine.
        device_type: "cuda", or "cpu" on emulated ranks.
        device_index: This rank's own GPU (index among the visible devices); None on the CPU.
        backend: The default group's backend, "nccl" or "gloo".
        emulated: True on gloo CPU ranks standing in for GPUs (``--mgpu-fallback=cpu``).
        seed: The seed every rank was given (``--mgpu-seed``).
        devices: The ``torch.device`` of every device this process may use: ``cuda:i`` on GPUs; on
            emulated ranks ``cpu`` once per device the test stands in for, so code written for N
            devices (``devs[0]``, ``devs[-1]``, ``len(devs)``) runs unchanged.
    """

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

    def device(self) -> torch.device:
        """This rank's ``torch.device``, as ``pytest_mgpu.rank_device()`` returns it."""
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
    """The current rank's identity: rank, world size, device, backend, seed, devices.

    Returns:
        The ``RankContext`` of the rank this code runs in.

    Raises:
        RuntimeError: Outside a rank started by pytest-mgpu (a test's body, plain Python).
    """
    if _current is None:
        raise RuntimeError(
            "rank_context()/rank_device() only work inside a function run by dist.run() (or "
            "pytest_mgpu.simulate()); call them from the function you pass to it, not from the test body"
        )
    return _current


def rank_device() -> torch.device:
    """This rank's ``torch.device``: ``device = pytest_mgpu.rank_device()`` runs on GPUs and CPU ranks
    alike, where ``.cuda()``, ``.to(rank)`` or ``torch.cuda.set_device(rank)`` need a GPU.

    Returns:
        Its own GPU (``cuda:i``), or ``cpu`` on emulated ranks.

    Raises:
        RuntimeError: Outside a rank started by pytest-mgpu.
    """
    return rank_context().device()


def in_rank() -> bool:
    """Whether this code runs inside a rank started by pytest-mgpu (``dist.run``, ``dist.spawn``, the
    parity and timing calls, ``simulate``), where ``rank_context()`` has an answer.

    Returns:
        True in such a rank, False in the test process or plain Python.
    """
    return _current is not None
