"""A DDP classifier trainer with ``OneCycleLR`` stepped per batch, SGD with Nesterov momentum and
weight decay, and cross-entropy with label smoothing; a ``DistributedSampler`` (shuffled, seeded,
``set_epoch`` every epoch) and a ``DataLoader`` of the per-rank batch; ``total_steps = epochs *
len(loader)``. The one-device run reads the same rows with ``DistributedSampler(num_replicas=1,
rank=0)`` and the global batch.

Follows the fast.ai / Leslie Smith one-cycle recipe as in the PyTorch ``OneCycleLR`` docs
(``scheduler = OneCycleLR(optimizer, max_lr=0.01, steps_per_epoch=len(data_loader), epochs=10)``,
``scheduler.step()`` after each batch), pytorch/vision ``references/classification/train.py``
(``nn.CrossEntropyLoss(label_smoothing=args.label_smoothing)``, ``train_sampler.set_epoch(epoch)``,
SGD ``nesterov="nesterov" in opt_name``) and the PyTorch DDP tutorial's ``DistributedSampler``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from .common import gen

DIN, HID, CLASSES, N, BATCH, EPOCHS = 10, 24, 5, 64, 8, 3
MAX_LR, MOMENTUM, WD, SMOOTH = 0.4, 0.9, 5e-4, 0.1
STEPS = 8   # two epochs of four global batches at 2 ranks
CORRECT = {"default": (2,)}
BUGS = {
    "total_steps_dataset": "OneCycleLR's steps_per_epoch = len(dataset) // batch_size (the per-rank batch), not len(loader)",
    "sched_per_epoch": "OneCycleLR stepped once per epoch (after the batch loop) instead of once per batch",
    "no_set_epoch": "train_sampler.set_epoch(epoch) never called: every epoch shuffles alike",
    "smoothing_twice": "targets smoothed by hand into soft labels and passed to a loss that also has label_smoothing=0.1",
    "max_lr_times_world": "max_lr multiplied by the world size (linear scaling) though the one-device run uses the global batch's",
}

g = gen(41)
DATA = TensorDataset(torch.randn(N, DIN, generator=g), torch.randint(0, CLASSES, (N,), generator=g))


def make_model() -> nn.Module:
    return nn.Sequential(nn.Linear(DIN, HID), nn.ReLU(), nn.Linear(HID, CLASSES))


def fit(model, sampler, batch, max_lr, bug) -> None:
    loader = DataLoader(DATA, batch_size=batch, sampler=sampler)
    opt = torch.optim.SGD(model.parameters(), lr=max_lr, momentum=MOMENTUM, nesterov=True, weight_decay=WD)
    per_epoch = N // batch if bug == "total_steps_dataset" else len(loader)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=max_lr, epochs=EPOCHS, steps_per_epoch=per_epoch)
    criterion = nn.CrossEntropyLoss(label_smoothing=SMOOTH)
    for epoch in range(EPOCHS):
        if bug != "no_set_epoch":
            sampler.set_epoch(epoch)
        for x, y in loader:
            opt.zero_grad()
            if bug == "smoothing_twice":
                y = F.one_hot(y, CLASSES).float() * (1 - SMOOTH) + SMOOTH / CLASSES
            criterion(model(x), y).backward()
            opt.step()
            if bug != "sched_per_epoch":
                sched.step()
        if bug == "sched_per_epoch":
            sched.step()


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: DDP, its sampler's rows, the per-rank batch."""
    sampler = DistributedSampler(DATA, shuffle=True, seed=0)
    lr = MAX_LR * world_size if bug == "max_lr_times_world" else MAX_LR
    fit(DDP(make_model()), sampler, BATCH, lr, bug)


def reference(world_size: int) -> None:
    """One device: the same rows, the global batch."""
    sampler = DistributedSampler(DATA, num_replicas=1, rank=0, shuffle=True, seed=0)
    fit(make_model(), sampler, BATCH * world_size, MAX_LR, None)
