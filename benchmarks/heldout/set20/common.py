"""Helpers of the heldout20 families: heldout19's (heldout18's rank queries, seeded generator, autograd
all-gather / all-reduce, plain all-reduce / all-gather, global-batch batch norm, torchrun environment, and
heldout19's ``MaskDropout`` whose keep-mask is set from outside: the rank's rows of a global draw).
"""
from __future__ import annotations

from ..set19.common import (MaskDropout, all_gather_grad, all_gather_plain, all_reduce_grad, all_reduce_sum, gen, rank,
                            torchrun_env, world)

__all__ = ["MaskDropout", "all_gather_grad", "all_gather_plain", "all_reduce_grad", "all_reduce_sum", "gen", "rank",
           "torchrun_env", "world"]
