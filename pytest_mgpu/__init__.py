"""pytest-mgpu: test multi-GPU PyTorch training with real process groups, on GPUs or CPU ranks."""
from typing import TYPE_CHECKING

from ._context import RankContext, in_rank, rank_context, rank_device
from .devices import DevicePlan
from .dist import Dist
from .launch.errors import RankFailure, RankLeftoverWarning
from .markers import world_sizes
from .simulate import Simulation, simulate
from .timing.measure import Measurement, TaskSpec

if TYPE_CHECKING:  # imported on first use (``__getattr__`` below); named here for type checkers and docs
    from .parity.report import ParityError, ParityReport
    from .parity.resume.api import ResumeSetupError
    from .parity.resume.folder import checkpoint_dir
    from .parity.resume.verdict import UninterruptedDiverged
    from .parity.counts import StepCountError
    from .timing.messages import TimingRegressionWarning

__all__ = [
    "DevicePlan",
    "Dist",
    "Measurement",
    "ParityError",
    "ParityReport",
    "RankContext",
    "RankFailure",
    "RankLeftoverWarning",
    "ResumeSetupError",
    "Simulation",
    "StepCountError",
    "TaskSpec",
    "TimingRegressionWarning",
    "UninterruptedDiverged",
    "checkpoint_dir",
    "in_rank",
    "rank_context",
    "rank_device",
    "simulate",
    "world_sizes",
]
__version__ = "0.1.0"


_LAZY = {
    "ParityError": ".parity.report",
    "ParityReport": ".parity.report",
    "ResumeSetupError": ".parity.resume.api",
    "StepCountError": ".parity.counts",
    "TimingRegressionWarning": ".timing.messages",
    "UninterruptedDiverged": ".parity.resume.verdict",
    "checkpoint_dir": ".parity.resume.folder",
}


def __getattr__(name: str):
    """The parity names, imported on first use: ``import pytest_mgpu`` (in every pytest run, and
    in every rank) stays free of the parity package's imports (tabulate, ~60 ms)."""
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module 'pytest_mgpu' has no attribute {name!r}")
