"""What every runner does inside a rank: the calls the parity worker makes each step."""
from __future__ import annotations

from typing import List, Optional

from ..batches import SumOrder


class Runner:
    """One strategy inside one rank. The worker calls, every step: forward_backward, grads,
    optimizer_step, params, buffers. Dict-returning methods are collective where the strategy needs
    it and return full tensors (any device) on rank 0, None elsewhere.

    Every runner is built as ``cls(model, opts, ctx, loss_fn, optimizer_fn, example, world)``:
    ``opts`` the registry's full option set, ``example`` the step-0 batch (a traced pipeline needs
    its shapes), ``world`` the devices the strategy spans (ranks, or the devices of one process)."""

    outputs_comparable = False  # whether forward_backward returns the global batch's output

    def __init__(self, model, opts, ctx, loss_fn, optimizer_fn, example, world):
        self.ctx, self.loss_fn = ctx, loss_fn
        self.rank, self.world_size = ctx.rank, ctx.world_size
        self.microbatches = 1
        self.shard_sizes: List[int] = []
        self.stages: List[List[str]] = []

    def forward_backward(self, inputs, targets):  # -> (global loss as a 0-d tensor or float, output)
        raise NotImplementedError

    def sum_order(self, batch: int) -> Optional[SumOrder]:
        """How this strategy splits a global batch of ``batch``; None: in the reference's order."""
        return None

    def optimizer_step(self):
        self.optimizer.step()

    def grads(self):
        return self._local(lambda m: {n: p.grad for n, p in m.named_parameters()})

    def params(self):
        return self._local(lambda m: dict(m.named_parameters()))

    def buffers(self):
        return self._local(lambda m: dict(m.named_buffers()))

    def _local(self, get):
        return get(self.module) if self.rank == 0 else None
