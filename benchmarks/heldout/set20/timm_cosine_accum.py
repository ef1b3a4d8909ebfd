"""timm's ``train.py`` loop on a small MLP classifier under DDP: ``create_optimizer_v2(model, opt="momentum",
weight_decay=...)`` (``filter_bias_and_bn``: biases and LayerNorm parameters in a no-decay group), the base
learning rate scaled linearly by the global batch (``lr = lr_base * global_batch_size / lr_base_size`` with
``global_batch_size = batch_size * world_size * grad_accum_steps``), ``CosineLRScheduler(t_initial=updates,
warmup_t, warmup_lr_init, lr_min, t_in_epochs=False)`` stepped per update with ``step_update(num_updates)``
after ``num_updates += 1``, ``LabelSmoothingCrossEntropy(0.1)``, gradient accumulation over 2 micro-batches
with ``model.no_sync()`` on all but the last (``need_update``) and ``loss / accum_steps``, a
``DistributedSampler(shuffle=True)`` with ``set_epoch(epoch)``, 2 epochs; each epoch ``train_one_epoch``
starts with ``model.train()`` and ends with a ``validate`` pass (``model.eval()``, ``torch.no_grad()``,
loss all-reduced, only logged). The dropout's keep-masks are drawn for the global micro-batch (rank-major
rows) by a generator seeded per micro-batch; each rank keeps its rows.

The one-device reference: each global micro-batch is the concatenation, in rank order, of the ranks'
sampler batches (the samplers built with explicit ``num_replicas`` / ``rank``), the same accumulation,
optimizer factory, learning rate and schedule.

Follows huggingface/pytorch-image-models ``train.py`` (``train_one_epoch``: ``need_update``,
``model.no_sync()``, ``loss /= accum_steps``, ``num_updates += 1`` then ``lr_scheduler.step_update(
num_updates=num_updates)``; the lr scaling by ``global_batch_size``; ``loader_train.sampler.set_epoch``;
``lr_scheduler.step(epoch + 1, eval_metric)`` after ``validate``), ``timm/optim/_optim_factory.py``
(``create_optimizer_v2``, ``param_groups_weight_decay``), ``timm/scheduler/cosine_lr.py``,
``timm/scheduler/scheduler.py`` (``step_update`` acts only when ``t_in_epochs=False``) and
``timm/loss/cross_entropy.py``.
"""
from __future__ import annotations

from contextlib import nullcontext

import torch
import torch.distributed as tdist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from .common import MaskDropout, gen, rank

DI, H, C, BATCH, ACC, EPOCHS, PER_EPOCH, SEED = 12, 32, 5, 4, 2, 2, 3, 2001
LR_BASE, LR_BASE_SIZE, WD, P, WARMUP = 0.05, 16, 0.05, 0.25, 2
UPDATES = EPOCHS * PER_EPOCH
STEPS = UPDATES
CORRECT = {"default": (2, 4)}
BUGS = {
    "lr_scaled_by_local_batch": "the linear lr scaling uses the per-process batch (batch_size * grad_accum_steps) instead of the global batch: the world size is left out, the learning rate is W times too small",
    "t_in_epochs_left_true": "CosineLRScheduler is built with the default t_in_epochs=True while it is driven by step_update: step_update does nothing and the lr only moves at the per-epoch step(epoch), warm-up counted in epochs",
    "step_update_before_increment": "lr_scheduler.step_update(num_updates) is called before num_updates += 1: the schedule lags one update (the warm-up's first value is used twice)",
    "step_update_per_micro": "step_update is called after every micro-batch with the micro-batch counter: the warm-up and cosine run accum_steps times too fast",
    "sampler_no_set_epoch": "the DistributedSampler's set_epoch(epoch) is never called: every epoch replays epoch 0's shuffle",
    "no_sync_on_last_micro": "the no_sync condition is inverted: the first micro-batch's backward all-reduces and the last one's stays local, so the accumulated gradients are not averaged across ranks",
    "train_mode_not_restored": "model.train() is called once before the epoch loop and not at the start of each train_one_epoch: after the first validate() the second epoch trains in eval mode (no dropout)",
}


def make_model():
    torch.manual_seed(SEED)
    return nn.Sequential(nn.Linear(DI, H), nn.LayerNorm(H), nn.GELU(), MaskDropout(P), nn.Linear(H, H), nn.GELU(),
                         nn.Linear(H, C))


def dataset(w: int) -> TensorDataset:
    n = PER_EPOCH * ACC * BATCH * w
    g = gen(SEED)
    protos = torch.randn(C, DI, generator=g) * 1.3
    y = torch.randint(0, C, (n,), generator=g)
    return TensorDataset(protos[y] + torch.randn(n, DI, generator=g), y)


def val_set():
    g = gen(SEED + 1)
    return torch.randn(8, DI, generator=g), torch.randint(0, C, (8,), generator=g)


def masks(epoch: int, micro: int, w: int):
    return (torch.rand(BATCH * w, H, generator=gen(SEED + 100 * epoch + micro + 7)) > P).float()


def factories(model, w: int, bug=None):
    from timm.loss import LabelSmoothingCrossEntropy
    from timm.optim import create_optimizer_v2
    from timm.scheduler import CosineLRScheduler

    global_batch = BATCH * ACC * (1 if bug == "lr_scaled_by_local_batch" else w)
    lr = LR_BASE * global_batch / LR_BASE_SIZE
    opt = create_optimizer_v2(model, opt="momentum", lr=lr, weight_decay=WD, momentum=0.9)
    sched = CosineLRScheduler(opt, t_initial=UPDATES, lr_min=0.1 * lr, warmup_t=WARMUP, warmup_lr_init=0.2 * lr,
                              t_in_epochs=bug == "t_in_epochs_left_true")
    return opt, sched, LabelSmoothingCrossEntropy(smoothing=0.1)


def validate(model, loss_fn, w):
    model.eval()
    vx, vy = val_set()
    with torch.no_grad():
        loss = loss_fn(model(vx), vy).detach()
    if w > 1 and tdist.is_initialized():
        tdist.all_reduce(loss)
        loss /= w
    return loss.item()


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: timm's train_one_epoch / validate loop with DDP and a DistributedSampler."""
    r, w = rank(), world_size
    net = make_model()
    model = DDP(net)
    opt, sched, loss_fn = factories(net, w, bug)
    ds = dataset(w)
    sampler = DistributedSampler(ds, num_replicas=w, rank=r, shuffle=True, seed=SEED)
    loader = DataLoader(ds, batch_size=BATCH, sampler=sampler)
    num_updates, micro_count = 0, 0
    if bug == "train_mode_not_restored":
        model.train()
    for epoch in range(EPOCHS):
        if bug != "sampler_no_set_epoch":
            sampler.set_epoch(epoch)
        if bug != "train_mode_not_restored":
            model.train()
        for micro, (x, y) in enumerate(loader):
            need_update = (micro + 1) % ACC == 0
            sync = not need_update if bug == "no_sync_on_last_micro" else need_update
            net[3].mask = masks(epoch, micro, w)[r * BATCH:(r + 1) * BATCH]
            with (nullcontext() if sync else model.no_sync()):
                loss = loss_fn(model(x), y) / ACC
                loss.backward()
            net[3].mask = None
            micro_count += 1
            if bug == "step_update_per_micro":
                sched.step_update(num_updates=micro_count)
            if not need_update:
                continue
            opt.step()
            opt.zero_grad()
            if bug == "step_update_before_increment":
                sched.step_update(num_updates=num_updates)
                num_updates += 1
            elif bug != "step_update_per_micro":
                num_updates += 1
                sched.step_update(num_updates=num_updates)
            else:
                num_updates += 1
        eval_metric = validate(model, loss_fn, w)
        sched.step(epoch + 1, eval_metric)


def reference(world_size: int) -> None:
    """One device: the ranks' sampler batches concatenated in rank order, the same loop."""
    w = world_size
    model = make_model()
    opt, sched, loss_fn = factories(model, w)
    ds = dataset(w)
    num_updates = 0
    for epoch in range(EPOCHS):
        loaders = []
        for r in range(w):
            s = DistributedSampler(ds, num_replicas=w, rank=r, shuffle=True, seed=SEED)
            s.set_epoch(epoch)
            loaders.append(DataLoader(ds, batch_size=BATCH, sampler=s))
        model.train()
        for micro, parts in enumerate(zip(*loaders)):
            x, y = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
            model[3].mask = masks(epoch, micro, w)
            (loss_fn(model(x), y) / ACC).backward()
            model[3].mask = None
            if (micro + 1) % ACC:
                continue
            opt.step()
            opt.zero_grad()
            num_updates += 1
            sched.step_update(num_updates=num_updates)
        eval_metric = validate(model, loss_fn, 1)
        sched.step(epoch + 1, eval_metric)
