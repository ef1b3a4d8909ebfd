"""The simulated tier: ``simulate(fn, world_size=W, rank=r)`` runs one rank of a W-rank job under
PyTorch's fake process group, counting collectives and memory (see ``api``). Torch-free to import."""
from .api import SimulateError, simulate
from .result import MemoryFigures, Simulation, StepFigures
from .steps import step

__all__ = ["MemoryFigures", "SimulateError", "Simulation", "StepFigures", "simulate", "step"]
