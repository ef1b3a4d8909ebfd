"""Gradient parity: does a model trained with a strategy on N devices train like it does on one?

``dist.assert_parity(strategy, model_fn, batch_fn, ...)`` (see ``engine.assert_parity``).
"""
from .engine import assert_parity, cross_entropy, sgd_momentum
from .report import ParityError, ParityReport
from .registry import STRATEGIES, StrategyError
from .judge.tolerance import Tolerance

__all__ = [
    "STRATEGIES",
    "ParityError",
    "ParityReport",
    "StrategyError",
    "Tolerance",
    "assert_parity",
    "cross_entropy",
    "sgd_momentum",
]
