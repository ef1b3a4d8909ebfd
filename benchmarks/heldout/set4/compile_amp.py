"""A small MLP classifier under DDP compiled with ``torch.compile(backend="aot_eager")``, trained with
the AMP recipe's autocast (bfloat16 on CPU) and ``GradScaler``, gradient clipping, a ``OneCycleLR`` schedule and a
validation pass every few steps.

Follows the PyTorch docs: "Automatic Mixed Precision" recipe and ``torch.amp`` notes ("Working with
Unscaled Gradients": ``scaler.scale(loss).backward()``, ``scaler.unscale_(optimizer)``, then
``clip_grad_norm_``, ``scaler.step(optimizer)``, ``scaler.update()``; ``torch.autocast(device_type,
dtype=...)`` around the forward and loss only), the DDP notes on ``torch.compile`` (wrap in DDP, then
``torch.compile(ddp_model)``), the ``OneCycleLR`` docs (``total_steps = epochs * len(data_loader)``,
``scheduler.step()`` after ``optimizer.step()`` every batch), the DistributedSampler docs
(``sampler.set_epoch(epoch)`` before each epoch) and the ImageNet example's validation
(``model.eval()``, ``torch.no_grad()``, ``model.train()`` again). A step is one ``optimizer.step()``:
eight steps, across an epoch boundary, with validation after every fourth.

``USE_AMP`` (the recipe's ``use_amp`` switch) is off: the GradScaler still scales and unscales (exact
powers of two in float32), but a bfloat16 forward cannot agree with the one-device run beyond bf16
roundoff (the gradient sums round at another batch split), about 3e-2 relative on a zero-initialised
bias after one step, measured with ``check.py``.
"""
from __future__ import annotations

import torch
import torch.distributed as tdist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from .common import gen

SEED, ROWS, DIM, CLASSES, BATCH, MAX_LR, EPOCHS, MAX_NORM = 17, 48, 16, 4, 4, 0.2, 3, 2.0
STEPS = 8
VAL_EVERY = 4
USE_AMP = False  # the recipe's ``use_amp`` switch: bfloat16 autocast disagrees with one device at bf16 level
CORRECT = {"default": (2, 4), "val_every_2": (2,)}
BUGS = {
    "clip_before_unscale": "clip_grad_norm_ on the scaled gradients (scaler.unscale_ left out before clipping)",
    "onecycle_steps_per_device": "OneCycleLR total_steps from len(dataset) // per-device batch: the schedule W x too long",
    "sched_before_step": "scheduler.step() called before optimizer.step() (the schedule one step ahead)",
    "no_set_epoch": "sampler.set_epoch(epoch) left out: the second epoch repeats the first one's order",
    "val_from_train_iter": "the validation pass draws its batch from the training iterator: a training batch skipped",
    "double_step": "optimizer.step() after scaler.step(optimizer): every batch applied twice",
}


def mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(DIM, 32), nn.LayerNorm(32), nn.ReLU(), nn.Linear(32, 32), nn.ReLU(),
                         nn.Linear(32, CLASSES))


def table(seed: int, n: int) -> TensorDataset:
    g = gen(seed)
    x = torch.randn(n, DIM, generator=g)
    return TensorDataset(x, (x[:, :CLASSES] + 0.3 * torch.randn(n, CLASSES, generator=g)).argmax(1))


def validate(model, loader, amp: bool) -> float:
    model.eval()
    total = torch.zeros(2)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
        for x, y in loader:
            total += torch.stack([nn.functional.cross_entropy(model(x), y, reduction="sum").float(),
                                  torch.tensor(float(len(y)))])
    if tdist.is_initialized():
        tdist.all_reduce(total)
    model.train()
    return (total[0] / total[1]).item()


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: torch.compile(DDP(model)), the AMP recipe's step, OneCycleLR, validation."""
    amp, val_every = USE_AMP, 2 if variant == "val_every_2" else VAL_EVERY
    torch.manual_seed(SEED)
    model = torch.compile(DDP(mlp()), backend="aot_eager")
    optimizer = torch.optim.SGD(model.parameters(), lr=MAX_LR, momentum=0.9)
    data, val = table(1, ROWS), table(2, 16)
    sampler = DistributedSampler(data, shuffle=True, seed=SEED)
    loader = DataLoader(data, batch_size=BATCH, sampler=sampler)
    val_loader = DataLoader(val, batch_size=BATCH, sampler=DistributedSampler(val, shuffle=False))
    total = EPOCHS * (len(data) // BATCH if bug == "onecycle_steps_per_device" else len(loader))
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=MAX_LR, total_steps=total)
    scaler = torch.amp.GradScaler("cpu")
    steps = 0
    for epoch in range(EPOCHS):
        if bug != "no_set_epoch":
            sampler.set_epoch(epoch)
        it = iter(loader)
        for x, y in it:
            optimizer.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=amp):
                loss = nn.functional.cross_entropy(model(x), y)
            scaler.scale(loss).backward()
            if bug != "clip_before_unscale":
                scaler.unscale_(optimizer)
            nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
            if bug == "sched_before_step":
                scheduler.step()
            scaler.step(optimizer)
            if bug == "double_step":
                optimizer.step()
            scaler.update()
            if bug != "sched_before_step":
                scheduler.step()
            steps += 1
            if steps == STEPS:
                return
            if steps % val_every == 0:
                validate(model, [next(it)] if bug == "val_from_train_iter" else val_loader, amp)


def reference(world_size: int) -> None:
    """One device: the same compiled model and step, the global batch in the ranks' order."""
    torch.manual_seed(SEED)
    model = torch.compile(mlp(), backend="aot_eager")
    optimizer = torch.optim.SGD(model.parameters(), lr=MAX_LR, momentum=0.9)
    data, val = table(1, ROWS), table(2, 16)
    sampler = DistributedSampler(data, num_replicas=1, rank=0, shuffle=True, seed=SEED)
    loader = DataLoader(data, batch_size=BATCH * world_size, sampler=sampler)
    scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=MAX_LR, total_steps=EPOCHS * len(loader))
    scaler = torch.amp.GradScaler("cpu")
    steps = 0
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            with torch.autocast("cpu", dtype=torch.bfloat16, enabled=USE_AMP):
                loss = nn.functional.cross_entropy(model(x), y)
            scaler.scale(loss).backward()
            scaler.unscale_(optimizer)
            nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
            scaler.step(optimizer)
            scaler.update()
            scheduler.step()
            steps += 1
            if steps == STEPS:
                return
            if steps % VAL_EVERY == 0:
                validate(model, DataLoader(val, batch_size=BATCH * world_size), USE_AMP)
