"""DDP with gradient accumulation and a chained schedule: a linear warm-up then cosine with warm
restarts, ``SequentialLR([LinearLR(start_factor=0.1, total_iters=WARM), CosineAnnealingWarmRestarts(
T_0=one epoch, T_mult=2)], milestones=[WARM])``, both lengths in optimizer updates and stepped once per update;
``DistributedSampler`` (same seed on every rank, ``set_epoch``) and a ``DataLoader``; accumulation over
``ACCUM`` micro-batches with ``no_sync`` on all but the last, the loss divided by ``ACCUM``; the
gradient norm clipped once per update, after the last backward; a timm ``ModelEmaV3`` updated after
every optimizer step and validated (EMA weights only, loss all-reduced) every 2 updates.

Follows the PyTorch ``torch.optim.lr_scheduler`` docs and source (``SequentialLR``, ``LinearLR``,
``CosineAnnealingWarmRestarts``: ``T_0``, ``T_mult``), the DDP ``no_sync`` docs, pytorch/examples
``imagenet/main.py`` (``DistributedSampler``, ``set_epoch``), huggingface/transformers ``trainer.py``
(clip once per update, scheduler stepped after ``optimizer.step()`` when the accumulation ends, the
warm-up in updates) and huggingface/pytorch-image-models ``train.py`` (``ModelEmaV3``,
``model_ema.update(model, step=num_updates)``, validation of the EMA weights). The one-device reference
takes, per update, all ranks' micro-batches of that update at once (the mean loss over its rows).
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from timm.utils import ModelEmaV3
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.optim.lr_scheduler import CosineAnnealingWarmRestarts, LinearLR, SequentialLR
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from .common import all_reduce, gen, rank

DIN, H, C, N, MICRO, ACCUM, EPOCHS = 8, 32, 4, 32, 4, 2, 3
WARM = 2  # optimizer updates; T_0: one epoch of updates
LR, MOMENTUM, MAX_NORM, SEED = 0.2, 0.9, 0.1, 19
STEPS = 6  # EPOCHS * N / (2 ranks * MICRO * ACCUM)
CORRECT = {"default": (2,)}
BUGS = {
    "sched_step_micro": "the scheduler stepped after every micro-batch, not once per optimizer update",
    "warmup_in_micro": "warm-up length and SequentialLR milestone counted in micro-batches (x ACCUM), stepped per update",
    "t0_from_dataset": "CosineAnnealingWarmRestarts T_0 from len(dataset) // (batch * ACCUM) (global data, not the rank's loader)",
    "no_sync_last": "no_sync() wraps the LAST micro-batch's backward instead of the first ones (its gradient never all-reduced)",
    "clip_each_micro": "clip_grad_norm_ called after every micro-batch's backward, on partial local gradients",
    "sequential_double_step": "the inner CosineAnnealingWarmRestarts stepped as well as the SequentialLR",
    "sampler_seed_rank": "DistributedSampler(seed=rank): the ranks shuffle differently, so their shards overlap",
}


def make_model() -> nn.Module:
    return nn.Sequential(nn.Linear(DIN, H), nn.GELU(), nn.Linear(H, H), nn.GELU(), nn.Linear(H, C))


def dataset(seed: int, n: int = N) -> TensorDataset:
    g = gen(seed)
    x = torch.randn(n, DIN, generator=g)
    return TensorDataset(x, (x[:, :C] + 0.5 * torch.randn(n, C, generator=g)).argmax(1))


def build(updates_per_epoch: int, bug=None):
    torch.manual_seed(SEED)
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    warm = WARM * ACCUM if bug == "warmup_in_micro" else WARM
    t0 = N // (MICRO * ACCUM) if bug == "t0_from_dataset" else updates_per_epoch
    warmup = LinearLR(opt, start_factor=0.1, total_iters=warm)
    cosine = CosineAnnealingWarmRestarts(opt, T_0=t0, T_mult=2, eta_min=LR * 0.05)
    return model, opt, SequentialLR(opt, [warmup, cosine], milestones=[warm]), cosine


def validate(ema: ModelEmaV3, r: int, w: int) -> None:
    x, y = dataset(77, 8)[r::w]
    with torch.no_grad():
        all_reduce(F.cross_entropy(ema.module(x), y, reduction="sum").reshape(1))


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: its sampler's micro-batches, ACCUM per update under no_sync, one clip and one step."""
    r, w = rank(), world_size
    ds = dataset(5)
    sampler = DistributedSampler(ds, num_replicas=w, rank=r, shuffle=True, seed=r if bug == "sampler_seed_rank" else 0)
    loader = DataLoader(ds, batch_size=MICRO, sampler=sampler, drop_last=True)
    model, opt, sched, cosine = build(len(loader) // ACCUM, bug)
    ema = ModelEmaV3(model, decay=0.9)
    ddp = DDP(model)
    updates = 0
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        for i, (x, y) in enumerate(loader):
            last = (i + 1) % ACCUM == 0
            quiet = last if bug == "no_sync_last" else not last
            with ddp.no_sync() if quiet else contextlib.nullcontext():
                (F.cross_entropy(ddp(x), y) / ACCUM).backward()
            if bug == "clip_each_micro":
                torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
            if bug == "sched_step_micro" and not last:
                sched.step()
            if not last:
                continue
            if bug != "clip_each_micro":
                torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
            opt.step()
            opt.zero_grad()
            sched.step()
            if bug == "sequential_double_step":
                cosine.step()
            updates += 1
            ema.update(model, step=updates)
            if updates % 2 == 0:
                validate(ema, r, w)


def reference(world_size: int) -> None:
    """One device: per update, every rank's micro-batches of that update together."""
    w = world_size
    ds = dataset(5)
    samplers = [DistributedSampler(ds, num_replicas=w, rank=r, shuffle=True, seed=0) for r in range(w)]
    per_update = MICRO * ACCUM
    model, opt, sched, _ = build(len(samplers[0]) // per_update)
    for epoch in range(EPOCHS):
        order = []
        for s in samplers:
            s.set_epoch(epoch)
            order.append(list(s))
        for u in range(len(order[0]) // per_update):
            idx = [j for r in range(w) for j in order[r][u * per_update:(u + 1) * per_update]]
            x, y = ds[idx]
            F.cross_entropy(model(x), y).backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
            opt.step()
            opt.zero_grad()
            sched.step()
