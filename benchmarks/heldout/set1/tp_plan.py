"""Tensor parallel: ``parallelize_module`` with ColwiseParallel / RowwiseParallel on a CPU mesh.

Follows pytorch/examples ``distributed/tensor_parallelism/tensor_parallel_example.py`` (a ToyModel
``in_proj -> relu -> out_proj`` parallelized ``{"in_proj": ColwiseParallel(), "out_proj":
RowwiseParallel()}``, AdamW with ``foreach=True``, every TP rank fed the same input by seeding it
with the iteration) and the TP tutorial's plan per block, here two such blocks and a
head parallelized as the tutorial's output layer
(``ColwiseParallel(output_layouts=Replicate())``); an MSE loss on seeded targets.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .common import rank, regress_rows, reseed_apart

DIM, HIDDEN, BATCH, LR = 16, 32, 8, 1e-2
STEPS = 4
CORRECT = {"default": (2, 4)}
BUGS = {
    "rank_data": "each rank seeds its input with the iteration and its rank, as a data-parallel loader would",
    "lr_rank": "rank 1's optimizer gets twice the learning rate",
    "loss_div_world": "the loss divided by the world size, as if the ranks' gradients were summed",
    "seed_apart": "seed + rank before building, parallelize_module(src_data_rank=None): each rank keeps its own chunk",
}


class ToyBlock(nn.Module):
    """The example's ToyModel: in_proj, relu, out_proj, with a residual."""

    def __init__(self):
        super().__init__()
        self.in_proj, self.out_proj = nn.Linear(DIM, HIDDEN), nn.Linear(HIDDEN, DIM)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.out_proj(F.relu(self.in_proj(x)))


class Toy(nn.Module):
    """Two ToyBlocks and a head."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([ToyBlock(), ToyBlock()])
        self.head = nn.Linear(DIM, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for blk in self.blocks:
            x = blk(x)
        return self.head(x)


def batch(step: int, salt: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """The step's input rows and targets (``salt`` != 0 only under the rank_data bug)."""
    return regress_rows(5000 + step + 100 * salt, BATCH, DIM, 4)


def _train(model: nn.Module, lr: float, data, scale: float = 1.0) -> None:
    """The example's loop: AdamW(foreach=True), zero_grad, forward, backward, step."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, foreach=True)
    for step in range(STEPS):
        x, y = data(step)
        opt.zero_grad()
        (F.mse_loss(model(x), y) * scale).backward()
        opt.step()


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: the same batch, the blocks' Linears split column- then row-wise."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    if bug == "seed_apart":
        reseed_apart()
    mesh = init_device_mesh("cpu", (world_size,))
    plan = {"head": ColwiseParallel(output_layouts=Replicate())}
    for i in range(2):
        plan[f"blocks.{i}.in_proj"], plan[f"blocks.{i}.out_proj"] = ColwiseParallel(), RowwiseParallel()
    src = None if bug == "seed_apart" else 0
    model = parallelize_module(Toy(), mesh, plan, src_data_rank=src)
    lr = 2 * LR if bug == "lr_rank" and rank() == 1 else LR
    salt = rank() if bug == "rank_data" else 0
    _train(model, lr, lambda step: batch(step, salt), 1 / world_size if bug == "loss_div_world" else 1.0)


def reference(world_size: int) -> None:
    """One device: the whole model, the same batch."""
    _train(Toy(), LR, batch)
