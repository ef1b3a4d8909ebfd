"""Validation inside the training loop under DDP: the training rows come from a ``DistributedSampler``
(``shuffle=True``, ``set_epoch(epoch)`` every epoch) through a ``DataLoader`` of the per-rank batch; every
``EVAL_EVERY`` steps the model goes to ``eval()``, a ``torch.no_grad()`` pass over the rank's shard of the
validation set (a ``DistributedSampler`` without shuffling) sums the loss and counts the rows, both are
all-reduced, the global mean feeds the schedule (the lr factor is halved when the validation loss did not
improve on the best so far), and the model goes back to ``train()``. The lr: cosine over the training
steps by hand, times that factor. An MLP with dropout (its mask drawn for the global batch from a
generator seeded by the count of training forwards, each rank keeping its rows: the one-device masks);
cross entropy, mean over the rank's rows; SGD momentum.

The one-device reference: the same schedule on the global batches (each the ranks' batches in rank
order, from the same samplers), the validation over the whole validation set.

Follows pytorch/examples ``imagenet/main.py`` (``DistributedSampler``, ``train_sampler.set_epoch(epoch)``,
``validate``: ``model.eval()``, ``with torch.no_grad()``, the metric all-reduced (``Summary.all_reduce``
of sum and count), ``model.train()`` in ``train``), ``torch/utils/data/distributed.py``
(``DistributedSampler.__iter__``: ``g.manual_seed(self.seed + self.epoch)``, ``indices[self.rank:
self.total_size:self.num_replicas]``) and huggingface/transformers ``trainer.py`` (evaluation every
``eval_steps`` inside the training loop, ``global_step`` counting optimizer steps only).
"""
from __future__ import annotations

import math

import torch
import torch.distributed as tdist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from .common import gen, rank

DIN, C, N, NV, GB, SEED = 6, 3, 40, 16, 8, 67
EPOCHS, EVAL_EVERY, LR, P_DROP = 3, 3, 0.4, 0.2
STEPS = EPOCHS * N // GB
CORRECT = {"default": (2, 4)}
BUGS = {
    "no_set_epoch": "train_sampler.set_epoch(epoch) is never called: every epoch reuses epoch 0's shuffle",
    "sampler_seed_per_rank": "each rank's DistributedSampler is seeded with seed + rank: the ranks' shuffles differ, rows are repeated or skipped",
    "eval_left_on": "model.train() is not called after validation: dropout stays off for the rest of training",
    "val_metric_local": "the validation loss is not all-reduced: each rank's schedule follows its own shard's loss",
    "eval_counts_steps": "the step counter that drives the cosine lr is also advanced by the validation batches",
    "val_train_mode": "validation runs without model.eval(): dropout is active in the validation forward (and uses up dropout draws)",
}


class SharedDropout(nn.Module):
    """Dropout whose mask is drawn for the global batch (a generator seeded by the count of training
    forwards); ``rows`` keeps this process's rows of it."""

    def __init__(self, p: float, width: int) -> None:
        super().__init__()
        self.p, self.width, self.rows, self.calls = p, width, slice(None), 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return x
        self.calls += 1
        keep = (torch.rand(GB, self.width, generator=gen(SEED + 1000 + self.calls)) >= self.p)[self.rows]
        return x * keep[:x.shape[0]].to(x.dtype) / (1 - self.p)


def net() -> nn.Module:
    torch.manual_seed(SEED)
    return nn.Sequential(nn.Linear(DIN, 16), nn.ReLU(), SharedDropout(P_DROP, 16), nn.Linear(16, C))


def datasets():
    g = gen(SEED)
    w = torch.randn(DIN, C, generator=g)
    x, xv = torch.randn(N, DIN, generator=g), 1.3 * torch.randn(NV, DIN, generator=g) + 0.3
    y = (x @ w + 0.8 * torch.randn(N, C, generator=g)).argmax(1)
    yv = (xv @ w + 0.8 * torch.randn(NV, C, generator=g)).argmax(1)
    return TensorDataset(x, y), TensorDataset(xv, yv)


def set_lr(opt, step: int, factor: float) -> None:
    opt.param_groups[0]["lr"] = LR * factor * 0.5 * (1 + math.cos(math.pi * min(step, STEPS) / STEPS))


def loaders(train_ds, val_ds, w: int, r: int, seed: int):
    ts = DistributedSampler(train_ds, num_replicas=w, rank=r, shuffle=True, seed=seed, drop_last=False)
    vs = DistributedSampler(val_ds, num_replicas=w, rank=r, shuffle=False)
    return ts, DataLoader(train_ds, batch_size=GB // w, sampler=ts), DataLoader(val_ds, batch_size=4, sampler=vs)


def validate(model, val_batches, reduce, bug=None):
    """Sum of the loss and count of rows over ``val_batches``, reduced by ``reduce``: the mean loss."""
    if bug != "val_train_mode":
        model.eval()
    tot, cnt, extra = torch.zeros(()), torch.zeros(()), 0
    with torch.no_grad():
        for x, y in val_batches:
            tot += F.cross_entropy(model(x), y, reduction="sum")
            cnt += len(y)
            extra += 1
    if bug != "eval_left_on":
        model.train()
    tot, cnt = reduce(tot), reduce(cnt)
    return (tot / cnt).item(), (extra if bug == "eval_counts_steps" else 0)


def run(model, fwd, epochs_batches, val_batches, reduce, bug=None) -> None:
    """The loop over ``epochs_batches(epoch)`` (this process's batches of that epoch)."""
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    step, counter, factor, best = 0, 0, 1.0, float("inf")
    model.train()
    for epoch in range(EPOCHS):
        for x, y in epochs_batches(epoch):
            set_lr(opt, counter, factor)
            loss = F.cross_entropy(fwd(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            step, counter = step + 1, counter + 1
            if step % EVAL_EVERY == 0:
                val, extra = validate(fwd, val_batches(), reduce, bug)
                counter += extra
                if val >= best:
                    factor *= 0.5
                best = min(best, val)


def _sum(t: torch.Tensor) -> torch.Tensor:
    t = t.clone()
    tdist.all_reduce(t)
    return t


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: the model under DDP, the samplers' shards, the validation metric all-reduced."""
    r = rank()
    model = net()
    model[2].rows = slice(r * GB // world_size, (r + 1) * GB // world_size)
    train_ds, val_ds = datasets()
    sampler, train_dl, val_dl = loaders(train_ds, val_ds, world_size, r,
                                        SEED + r if bug == "sampler_seed_per_rank" else SEED)

    def epoch_batches(epoch):
        if bug != "no_set_epoch":
            sampler.set_epoch(epoch)
        return train_dl

    run(model, DDP(model), epoch_batches, lambda: val_dl,
        (lambda t: t) if bug == "val_metric_local" else _sum, bug)


def reference(world_size: int) -> None:
    """One device: each global batch is the ranks' batches in rank order; validation over the whole set."""
    model = net()
    train_ds, val_ds = datasets()
    per_rank = [loaders(train_ds, val_ds, world_size, r, SEED) for r in range(world_size)]

    def epoch_batches(epoch):
        for s, _, _ in per_rank:
            s.set_epoch(epoch)
        for parts in zip(*[dl for _, dl, _ in per_rank]):
            yield torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])

    run(model, model, epoch_batches, lambda: DataLoader(val_ds, batch_size=4), lambda t: t)
