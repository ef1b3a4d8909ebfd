"""Stochastic weight averaging under DDP with a consistency term: an MLP with a batch norm (over the
global batch: heldout14's ``SyncBatchNorm1d``, as ``nn.SyncBatchNorm`` would on GPUs) trained with SGD
momentum; ``torch.optim.swa_utils.AveragedModel(model, use_buffers=True)`` made before the DDP wrap;
``CosineAnnealingLR`` stepped per update before ``SWA_START``, and from update ``SWA_START`` on (counted in
updates, ``step >= SWA_START``) ``swa_model.update_parameters(model)`` after every ``optimizer.step()`` and
``SWALR(swa_lr=0.05, anneal_epochs=2, anneal_strategy="cos")`` stepped instead of the cosine schedule.
Once the average holds a model (``n_averaged > 0``) the loss adds a consistency term, ``LAMBDA *
MSE(student logits, averaged model's logits)``, the averaged model run in eval mode (its averaged
running statistics, which ``use_buffers=True`` keeps in step with the averaged weights, so no
``update_bn`` is needed). Every random draw is made for the global batch by a generator seeded per step;
each rank keeps its rows. The reference runs the global batch in one process.

Follows pytorch/pytorch ``torch/optim/swa_utils.py`` (``AveragedModel``, ``SWALR``, ``update_bn``) and
the SWA recipe of the PyTorch docs ("Stochastic Weight Averaging", ``optim.rst``: ``if epoch >
swa_start: swa_model.update_parameters(model); swa_scheduler.step() else: scheduler.step()``), the
mean-teacher consistency loss (CuriousAI/mean-teacher ``main.py``: ``softmax_mse_loss`` against the
averaged model), and timm's SWA-in-the-loop use of averaged weights.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.optim.swa_utils import SWALR, AveragedModel

from .common import SyncBatchNorm1d, gen, rank

GB, DI, C, SEED = 8, 6, 3, 1703
LR, MOMENTUM, SWA_LR, SWA_START, LAMBDA = 0.2, 0.9, 0.05, 3, 2.0
STEPS = 8
CORRECT = {"default": (2, 4)}
BUGS = {
    "swa_start_off_by_one": "the SWA phase starts one update late (step > SWA_START instead of step >= SWA_START): the averaging, SWALR and the consistency term start late",
    "base_scheduler_still_stepped": "the cosine scheduler keeps being stepped after SWA starts, alongside SWALR: the two schedules fight over the learning rate",
    "swa_update_before_optimizer_step": "swa_model.update_parameters(model) is called before optimizer.step(): the average takes the previous weights",
    "bn_not_synced": "the model's batch norm is a plain per-rank BatchNorm1d (local batch statistics) instead of a synchronised batch norm over the global batch",
    "averaged_model_in_train_mode": "the averaged model is run in train mode for the consistency target: it normalises with batch statistics instead of its averaged running statistics",
    "averaged_buffers_not_tracked": "AveragedModel is built without use_buffers=True and update_bn is never run: the averaged model's batch norm keeps its initial running statistics",
    "swa_update_on_rank0_only": "the SWA average is updated on rank 0 only (guarded like checkpointing): the other ranks' averaged models stay empty and their consistency targets are missing",
}


def make_model(bug=None):
    torch.manual_seed(SEED)
    bn = nn.BatchNorm1d(16, track_running_stats=True) if bug == "bn_not_synced" else SyncBatchNorm1d(16)
    return nn.Sequential(nn.Linear(DI, 16), bn, nn.ReLU(), nn.Linear(16, C))


def batch(step: int):
    g = gen(SEED + step)
    y = torch.randint(0, C, (GB,), generator=g)
    x = torch.randn(GB, DI, generator=g) * 1.5 + F.one_hot(y, DI).float() * 1.5 + 0.5
    return x, y


def make_all(model, bug=None):
    swa = AveragedModel(model, use_buffers=bug != "averaged_buffers_not_tracked")
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=STEPS)
    swa_sched = SWALR(opt, swa_lr=SWA_LR, anneal_epochs=2, anneal_strategy="cos")
    return swa, opt, sched, swa_sched


def consistency(logits, x, swa, bug=None):
    if swa.n_averaged.item() == 0:
        return 0.0
    swa.train(bug == "averaged_model_in_train_mode")
    with torch.no_grad():
        target = swa(x)
    return LAMBDA * F.mse_loss(logits, target)


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    r, w = rank(), world_size
    model = make_model(bug)
    swa, opt, sched, swa_sched = make_all(model, bug)
    ddp = DDP(model)
    lb = GB // w
    start = SWA_START + 1 if bug == "swa_start_off_by_one" else SWA_START
    for step in range(STEPS):
        x, y = batch(step)
        x, y = x[r * lb:(r + 1) * lb], y[r * lb:(r + 1) * lb]
        logits = ddp(x)
        loss = F.cross_entropy(logits, y) + consistency(logits, x, swa, bug)
        opt.zero_grad()
        loss.backward()
        swa_phase = step >= start
        if swa_phase and bug == "swa_update_before_optimizer_step":
            swa.update_parameters(model)
        opt.step()
        if swa_phase:
            if bug != "swa_update_before_optimizer_step" and (bug != "swa_update_on_rank0_only" or r == 0):
                swa.update_parameters(model)
            swa_sched.step()
            if bug == "base_scheduler_still_stepped":
                sched.step()
        else:
            sched.step()


def reference(world_size: int) -> None:
    model = make_model()
    swa, opt, sched, swa_sched = make_all(model)
    for step in range(STEPS):
        x, y = batch(step)
        logits = model(x)
        loss = F.cross_entropy(logits, y) + consistency(logits, x, swa)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step >= SWA_START:
            swa.update_parameters(model)
            swa_sched.step()
        else:
            sched.step()
