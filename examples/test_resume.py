"""A trainer that checkpoints every few steps, stopped and resumed under ``dist.assert_resumes``.

The trainer saves its model, optimizer, scheduler and step in ``checkpoint_dir()`` and loads them if
they are there, as training scripts do. The test runs it through (12 steps), again stopped after
step 7, and again to resume from the checkpoint it left (after step 6): the resumed steps must train
like the uninterrupted ones. Drop ``scheduler.load_state_dict`` and the test names the cause.
"""
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import pytest_mgpu
from pytest_mgpu import world_sizes


def train(total_steps=12, save_every=3, global_batch=16):
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 2))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=4, gamma=0.5)
    model, step = DDP(model), 0
    path = pytest_mgpu.checkpoint_dir() / "last.pt"
    if path.exists():
        state = torch.load(path)
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
        step = state["step"]
    while step < total_steps:
        g = torch.Generator().manual_seed(step)  # the step's global batch; this rank takes its share
        x, y = torch.randn(global_batch, 8, generator=g), torch.randint(0, 2, (global_batch,), generator=g)
        share = slice(rank * global_batch // world, (rank + 1) * global_batch // world)
        loss = F.cross_entropy(model(x[share]), y[share])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        scheduler.step()
        step += 1
        if step % save_every == 0 and rank == 0:
            torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                        "scheduler": scheduler.state_dict(), "step": step}, path)
        dist.barrier()


@world_sizes(2, 4)
def test_training_resumes_where_it_stopped(dist):
    report = dist.assert_resumes(train, steps=12, stop_after=7)
    assert report.notes[0].startswith("resumed from the state after step 6 ")


@world_sizes(4)
def test_training_resumes_on_fewer_ranks(dist):
    dist.assert_resumes(train, steps=12, stop_after=7, world_size_after=2)
