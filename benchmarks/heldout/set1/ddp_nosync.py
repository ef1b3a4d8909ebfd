"""DDP gradient accumulation with ``no_sync()``, a StepLR per optimizer step, a random-feature buffer.

Follows the ``DistributedDataParallel.no_sync`` example in the pytorch docs (``with ddp.no_sync():``
for every micro-batch but the last, whose backward all-reduces the accumulated gradients), the
Hugging Face Accelerate gradient-accumulation guide (each micro-batch's loss divided by the
accumulation steps, ``zero_grad`` after the step), a ``DistributedSampler`` loader, and a model with a
registered random-Fourier-feature buffer (as positional / random-feature encoders register theirs).
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from .common import classify_table, rank, reseed_apart

DIM, FEATS, CLASSES, MICRO_ROWS, ACCUM, LR = 16, 8, 4, 8, 3, 0.05
STEPS = 4
ROWS = STEPS * ACCUM * MICRO_ROWS
CORRECT = {"default": (2, 4), "no_buffer_broadcast": (2,), "seeded_apart": (2,)}
BUGS = {
    "loss_not_divided": "each micro-batch's loss is not divided by the accumulation steps (3)",
    "nosync_all": "every micro-batch, the last included, runs under ddp.no_sync(): no all-reduce at all",
    "zero_grad_micro": "optimizer.zero_grad() inside the micro-batch loop",
    "buffers_apart": "seed + rank before building, DDP(broadcast_buffers=False): the feature buffer differs",
    "steplr_per_micro": "the StepLR scheduler is stepped after every micro-batch",
    "sampler_rank0": "DistributedSampler(ds, num_replicas=world_size, rank=0) hard-coded in every rank",
}


class RFFNet(nn.Module):
    """Random Fourier features (a fixed buffer), then a 2-layer classifier."""

    def __init__(self):
        super().__init__()
        self.register_buffer("freqs", torch.randn(DIM, FEATS))
        self.fc1, self.fc2 = nn.Linear(2 * FEATS, 32), nn.Linear(32, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        z = x @ self.freqs
        return self.fc2(torch.tanh(self.fc1(torch.cat([z.sin(), z.cos()], dim=-1))))


def _accumulate(model, loader, opt, sched, no_sync, bug=None) -> None:
    """ACCUM micro-batches per optimizer step; ``no_sync`` is a context for the non-final ones."""
    for i, (x, y) in enumerate(loader):
        last = (i + 1) % ACCUM == 0
        if bug == "zero_grad_micro":
            opt.zero_grad()
        ctx = no_sync() if (not last or bug == "nosync_all") else contextlib.nullcontext()
        with ctx:
            loss = F.cross_entropy(model(x), y)
            (loss if bug == "loss_not_divided" else loss / ACCUM).backward()
        if bug == "steplr_per_micro":
            sched.step()
        if last:
            opt.step()
            if bug != "steplr_per_micro":
                sched.step()
            opt.zero_grad()


def _optim(model: nn.Module):
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    return opt, torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: DDP, DistributedSampler (shuffled, epoch 0), micro-batches of MICRO_ROWS global rows."""
    if bug == "buffers_apart" or variant == "seeded_apart":
        reseed_apart()
    no_broadcast = bug == "buffers_apart" or variant == "no_buffer_broadcast"
    ddp = DDP(RFFNet(), broadcast_buffers=False) if no_broadcast else DDP(RFFNet())
    ds = classify_table(8000, ROWS, DIM, CLASSES)
    sampler = (DistributedSampler(ds, num_replicas=world_size, rank=0, seed=0) if bug == "sampler_rank0"
               else DistributedSampler(ds, seed=0))
    sampler.set_epoch(0)
    loader = DataLoader(ds, batch_size=MICRO_ROWS // world_size, sampler=sampler)
    opt, sched = _optim(ddp)
    _accumulate(ddp, loader, opt, sched, ddp.no_sync, bug)


def reference(world_size: int) -> None:
    """One device: the one-replica sampler, MICRO_ROWS rows per micro-batch."""
    net = RFFNet()
    ds = classify_table(8000, ROWS, DIM, CLASSES)
    sampler = DistributedSampler(ds, num_replicas=1, rank=0, seed=0)
    sampler.set_epoch(0)
    opt, sched = _optim(net)
    _accumulate(net, DataLoader(ds, batch_size=MICRO_ROWS, sampler=sampler), opt, sched,
                contextlib.nullcontext)
