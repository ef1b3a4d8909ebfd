"""``ZeroRedundancyOptimizer`` (Adam) over a DDP model.

Follows pytorch/tutorials ``recipes_source/zero_redundancy_optimizer.rst``: a stack of Linear
layers wrapped in DDP, ``ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.Adam,
lr=...)``, an MSE loss against random labels, ``zero_grad`` / ``backward`` / ``step`` per iteration;
here each rank's input is its block of a seeded global batch.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from .common import block, rank, regress_rows

DIM, OUT, GLOBAL_BATCH, LR = 16, 8, 8, 1e-2
STEPS = 4
CORRECT = {"default": (2, 4)}
BUGS = {
    "no_ddp": "ZeRO over the plain model: DDP forgotten, gradients never averaged across ranks",
    "rank_lr": "rank 1's ZeroRedundancyOptimizer gets twice the lr (its shard of the parameters)",
    "rank_seed_data": "each rank draws its batch from a generator seeded with its rank",
    "loss_div_world": "loss divided by the world size 'because DDP sums the gradients'",
}


def model() -> nn.Sequential:
    """The recipe's stack of Linear layers, small."""
    return nn.Sequential(nn.Linear(DIM, 32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, OUT))


def global_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global inputs and labels of a step."""
    return regress_rows(2000 + step, GLOBAL_BATCH, DIM, OUT)


def _local_batch(step: int, w: int, bug: str | None) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's rows of the step's batch (or, under ``rank_seed_data``, rows of its own)."""
    if bug == "rank_seed_data":
        return regress_rows(2000 + 100 * rank() + step, GLOBAL_BATCH // w, DIM, OUT)
    return tuple(block(t, rank(), w) for t in global_batch(step))


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: DDP + ZeroRedundancyOptimizer(Adam)."""
    from torch.distributed.optim import ZeroRedundancyOptimizer

    net = model()
    wrapped = net if bug == "no_ddp" else DDP(net)
    lr = 2 * LR if bug == "rank_lr" and rank() == 1 else LR
    opt = ZeroRedundancyOptimizer(wrapped.parameters(), optimizer_class=torch.optim.Adam, lr=lr)
    loss_fn = nn.MSELoss()
    for step in range(STEPS):
        x, y = _local_batch(step, world_size, bug)
        opt.zero_grad()
        loss = loss_fn(wrapped(x), y)
        if bug == "loss_div_world":
            loss = loss / world_size
        loss.backward()
        opt.step()


def reference(world_size: int) -> None:
    """One device: Adam on the global batch."""
    net = model()
    opt = torch.optim.Adam(net.parameters(), lr=LR)
    loss_fn = nn.MSELoss()
    for step in range(STEPS):
        x, y = global_batch(step)
        opt.zero_grad()
        loss_fn(net(x), y).backward()
        opt.step()
