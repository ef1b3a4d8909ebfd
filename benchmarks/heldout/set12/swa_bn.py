"""Stochastic weight averaging under DDP, then a short fine-tune from the averaged weights. A tiny MLP
whose BatchNorm is frozen (kept in eval mode, as when fine-tuning: the affine weights train, the
statistics do not) under DDP; SGD momentum; per epoch ``SPE`` iterations over a DistributedSampler-like
split of the global batches (each rank its block of rows). Epochs before ``SWA_START``: the base cosine
schedule (``CosineAnnealingLR`` stepped per epoch); from ``SWA_START`` on: ``swa_model.update_parameters
(model)`` and ``SWALR`` (``anneal_epochs=1``, cosine) stepped at the end of each epoch. After the last
epoch ``update_bn`` recomputes the averaged model's BatchNorm statistics over the whole training set
(every rank reads all of it: the statistics must be the one-device ones), the averaged weights and
statistics are loaded into the model, and ``FT_STEPS`` more steps train it at the SWA learning rate (BN
still frozen: the recomputed statistics shape the gradients).

The one-device reference runs the same on the global batches.

Follows the PyTorch docs' SWA recipe (``torch/optim/swa_utils.py`` docstrings; "Stochastic Weight
Averaging" in ``docs/source/optim.rst``: ``swa_model = AveragedModel(model)``, ``swa_scheduler =
SWALR(optimizer, swa_lr=0.05)``, ``if epoch > swa_start: swa_model.update_parameters(model);
swa_scheduler.step() else: scheduler.step()``, ``torch.optim.swa_utils.update_bn(loader, swa_model)``)
and pytorch/contrib ``torchcontrib/optim/swa.py`` (``swap_swa_sgd``: the averaged weights copied into the
model; ``bn_update`` over the training loader).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.optim.swa_utils import SWALR, AveragedModel, update_bn

from .common import gen, rank

DIN, C, GB, SEED = 6, 3, 8, 47
EPOCHS, SPE, SWA_START, FT_STEPS = 4, 2, 2, 2
LR, SWA_LR = 0.2, 0.05
STEPS = EPOCHS * SPE + FT_STEPS
CORRECT = {"default": (2, 4)}
BUGS = {
    "swa_start_late": "averaging and SWALR start one epoch late (epoch > swa_start instead of >=)",
    "update_per_step": "swa_model.update_parameters(model) is called every iteration instead of once per epoch",
    "update_bn_shard": "update_bn runs over the rank's shard of the training set, not the whole set",
    "update_bn_skipped": "update_bn is never called: the averaged model keeps the statistics copied at its creation",
    "base_sched_too": "the base cosine scheduler keeps being stepped after swa_start alongside SWALR",
    "params_only_copied": "only the averaged parameters are copied into the model; the recomputed BatchNorm statistics are not",
    "swalr_per_iter": "SWALR (anneal_epochs=1) is stepped every iteration instead of every epoch",
}


def net() -> nn.Module:
    torch.manual_seed(SEED)
    return nn.Sequential(nn.Linear(DIN, 12), nn.BatchNorm1d(12), nn.ReLU(), nn.Linear(12, C))


def data():
    g = gen(SEED)
    n = EPOCHS * SPE * GB
    x = torch.randn(n, DIN, generator=g) * 1.5 + 0.8
    y = (x[:, :C] + 0.4 * torch.randn(n, C, generator=g)).argmax(1)
    return x, y


def freeze_bn(model: nn.Module) -> None:
    model.train()
    for m in model.modules():
        if isinstance(m, nn.BatchNorm1d):
            m.eval()


def sgd_step(fwd, opt, x, y) -> None:
    loss = F.cross_entropy(fwd(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()


def run(model, fwd, rows, bn_rows, bug=None) -> None:
    """The schedule; ``rows`` keeps this process's block of a global batch, ``bn_rows`` the rows update_bn reads."""
    xs, ys = data()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=EPOCHS)
    swa_model = AveragedModel(model)
    swa_sched = SWALR(opt, swa_lr=SWA_LR, anneal_epochs=1, anneal_strategy="cos")
    start = SWA_START + 1 if bug == "swa_start_late" else SWA_START
    freeze_bn(model)
    for epoch in range(EPOCHS):
        for it in range(SPE):
            i = (epoch * SPE + it) * GB
            sgd_step(fwd, opt, rows(xs[i:i + GB]), rows(ys[i:i + GB]))
            if epoch >= start and bug == "update_per_step":
                swa_model.update_parameters(model)
            if epoch >= start and bug == "swalr_per_iter":
                swa_sched.step()
        if epoch >= start:
            if bug != "update_per_step":
                swa_model.update_parameters(model)
            if bug != "swalr_per_iter":
                swa_sched.step()
        if epoch < start or bug == "base_sched_too":
            sched.step()
    if bug != "update_bn_skipped":
        loader = [(bn_rows(xs[i:i + GB]),) for i in range(0, len(xs), GB)]
        update_bn(loader, swa_model)
    avg = swa_model.module
    if bug == "params_only_copied":
        with torch.no_grad():
            for p, q in zip(model.parameters(), avg.parameters()):
                p.copy_(q)
    else:
        model.load_state_dict(avg.state_dict())
    freeze_bn(model)
    for k in range(FT_STEPS):
        i = k * GB
        sgd_step(fwd, opt, rows(xs[i:i + GB]), rows(ys[i:i + GB]))


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: the model under DDP, its block of each global batch; update_bn over the whole set."""
    r, lb = rank(), GB // world_size
    model = net()
    ddp = DDP(model)
    mine = lambda t: t[r * lb:(r + 1) * lb]  # noqa: E731
    run(model, ddp, mine, mine if bug == "update_bn_shard" else (lambda t: t), bug)


def reference(world_size: int) -> None:
    """One device: the same schedule on the global batches."""
    model = net()
    run(model, model, lambda t: t, lambda t: t)
