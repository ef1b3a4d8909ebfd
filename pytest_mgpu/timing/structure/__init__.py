"""The exact half of performance: what a ``simulate()``, ``dist.benchmark``, ``assert_parity`` or
``assert_same_training`` call does per step (the collectives it issues by name and count, the bytes
each rank sends, CUDA peak memory), recorded as goldens in ``baselines/structure.json`` and judged
exactly (see ``judge``). Torch-free to import."""
from .figures import CallStructure, StepStructure
from .judge import Verdict

__all__ = ["CallStructure", "StepStructure", "Verdict"]
