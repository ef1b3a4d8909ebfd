"""pytest-mgpu: test multi-GPU PyTorch training with real process groups, on GPUs or CPU ranks."""
from ._context import RankContext, in_rank, rank_context, rank_device
from .devices import DevicePlan
from .launch.errors import RankFailure
from .markers import world_sizes
from .simulate import Simulation, simulate
from .timing.measure import Measurement, TaskSpec

__all__ = [
    "DevicePlan",
    "Measurement",
    "RankContext",
    "RankFailure",
    "Simulation",
    "TaskSpec",
    "in_rank",
    "rank_context",
    "rank_device",
    "simulate",
    "world_sizes",
]
__version__ = "0.1.0"
