"""pytest-mgpu: test multi-GPU PyTorch training with real process groups, on GPUs or CPU ranks."""
from ._context import RankContext, in_rank, rank_context, rank_device
from .devices import DevicePlan
from .dist import Dist
from .launch.errors import RankFailure, RankLeftoverWarning
from .markers import world_sizes
from .simulate import Simulation, simulate
from .timing.measure import Measurement, TaskSpec

__all__ = [
    "DevicePlan",
    "Dist",
    "Measurement",
    "ParityError",
    "RankContext",
    "RankFailure",
    "RankLeftoverWarning",
    "Simulation",
    "StepCountError",
    "TaskSpec",
    "TimingRegressionWarning",
    "checkpoint_dir",
    "in_rank",
    "rank_context",
    "rank_device",
    "simulate",
    "world_sizes",
]
__version__ = "0.1.0"


def __getattr__(name: str):
    """The parity errors, imported on first use: ``import pytest_mgpu`` (in every pytest run, and
    in every rank) stays free of the parity package's imports (tabulate, ~60 ms)."""
    if name == "ParityError":
        from .parity.report import ParityError

        return ParityError
    if name == "TimingRegressionWarning":
        from .timing.messages import TimingRegressionWarning

        return TimingRegressionWarning
    if name == "checkpoint_dir":
        from .parity.resume.folder import checkpoint_dir

        return checkpoint_dir
    if name == "StepCountError":
        from .parity.training import StepCountError

        return StepCountError
    raise AttributeError(f"module 'pytest_mgpu' has no attribute {name!r}")
