"""A loop whose model is ``torch.compile(DDP(model))`` (the DDP notes' order), for
``tests/test_compiled_loop.py``: the watch's hooks must stay out of the graph torch.compile traces.
Module level, so it travels to the ranks by name."""
from __future__ import annotations

import torch
import torch.distributed as tdist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from tests.own_grad_loops import ROWS, STEPS, batch, regression_model  # the same small regression


def train(world_size: int, bug: str = "") -> None:
    rank = tdist.get_rank()
    model = torch.compile(DDP(regression_model()), backend="aot_eager")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    n = ROWS // world_size
    for step in range(STEPS):
        x, y = batch(step)
        sl = slice(rank * n, (rank + 1) * n)
        loss = nn.functional.mse_loss(model(x[sl]), y[sl], reduction="sum" if bug == "sum" else "mean")
        opt.zero_grad()
        loss.backward()
        opt.step()


def reference(world_size: int) -> None:
    model = torch.compile(regression_model(), backend="aot_eager")
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(STEPS):
        x, y = batch(step)
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
