"""The YOLOv5 training loop's nominal-batch-size accumulation and per-iteration warm-up under DDP, on a
small detection-like head (a trunk with a batch norm over the global batch, heldout14's
``SyncBatchNorm1d`` as ``--sync-bn`` gives on GPUs; a box regression and a multi-label class output):
``accumulate = max(round(NBS / batch_size), 1)`` with ``batch_size`` the total batch over the ranks,
``weight_decay *= batch_size * accumulate / NBS``, three SGD (Nesterov) groups as ``smart_optimizer``
builds them (group 0 the biases without decay, group 1 the weights with decay, group 2 the batch-norm
weights without decay), ``LambdaLR`` with ``one_cycle(1, LRF, EPOCHS)`` stepped per epoch, and for the
first ``nw = round(WARMUP_EPOCHS * nb)`` iterations (``nb = len(train_loader)``, per process) the
accumulation ramped ``np.interp(ni, [0, nw], [1, NBS / batch_size]).round()``, every group's lr
interpolated from ``WARMUP_BIAS_LR`` (group 0, the biases) or 0 (the others) to ``initial_lr * lf(epoch)``
and the momentum from ``WARMUP_MOMENTUM`` to ``MOMENTUM``; an optimizer step (after ``clip_grad_norm_(10)``)
whenever ``ni - last_opt_step >= accumulate``. The loss is ``(lbox + lcls) * bs`` (per-process batch, as
``ComputeLoss`` returns it), times ``WORLD_SIZE`` under DDP ("gradient averaged between devices in DDP
mode"). Every random draw is made for the global batch by a generator seeded per iteration; each rank
keeps its rows.

Follows ultralytics/yolov5 ``train.py`` (``nbs``, ``accumulate``, ``hyp["weight_decay"] *= ...``,
``lf = one_cycle(...)``, the warm-up block with ``np.interp``, ``loss *= WORLD_SIZE``,
``if ni - last_opt_step >= accumulate``), ``utils/torch_utils.py`` (``smart_optimizer``: g[2] biases
first, g[0] weights with decay, g[1] BN weights) and ``utils/general.py`` (``one_cycle``).
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from .common import SyncBatchNorm1d, gen, rank

DI, H, NC, GB, NBS, N_DATA, EPOCHS, SEED = 10, 24, 3, 8, 20, 32, 4, 1806
LR0, LRF, MOMENTUM, WD, WARMUP_EPOCHS, WARMUP_MOMENTUM, WARMUP_BIAS_LR = 0.05, 0.1, 0.9, 0.2, 1.5, 0.8, 0.1
ITERS = EPOCHS * (N_DATA // GB)
STEPS = 9
CORRECT = {"default": (2, 4)}
BUGS = {
    "loss_not_times_world": "the `loss *= WORLD_SIZE` line is missing: with the per-process batch size in the loss, DDP's averaging leaves the gradient W times too small",
    "accumulate_from_local_batch": "accumulate is round(NBS / per-process batch) instead of round(NBS / total batch): W times more iterations accumulated per optimizer step",
    "weight_decay_not_scaled": "the weight decay is not scaled by batch_size * accumulate / NBS",
    "bias_warmup_on_wrong_group": "the warm-up bias lr (WARMUP_BIAS_LR) is applied to param group 2 (the batch-norm weights) instead of group 0 (the biases): the groups' order does not match the j == 0 test",
    "momentum_warmup_missing": "the warm-up does not interpolate the momentum from WARMUP_MOMENTUM: the full momentum is used from the first iteration",
    "warmup_len_from_dataset_size": "nb (iterations per epoch, for the warm-up length) is len(dataset) / per-process batch instead of len(train_loader): the warm-up lasts W times longer",
    "last_opt_step_not_updated": "last_opt_step is never updated after an optimizer step: once accumulate is reached the optimizer steps on every iteration",
}


class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.bn, self.fc2 = nn.Linear(DI, H), SyncBatchNorm1d(H), nn.Linear(H, H)
        self.box, self.cls = nn.Linear(H, 4), nn.Linear(H, NC)

    def forward(self, x):
        h = F.silu(self.fc2(F.silu(self.bn(self.fc1(x)))))
        return self.box(h), self.cls(h)


def make_model():
    torch.manual_seed(SEED)
    return Head()


def batch(ni: int):
    g = gen(SEED + ni)
    x = torch.randn(GB, DI, generator=g)
    box = torch.tanh(x[:, :4] * 0.8 + 0.3 * torch.randn(GB, 4, generator=g))
    cls = ((x[:, 4:4 + NC] + 0.5 * torch.randn(GB, NC, generator=g)) > 0.3).float()
    return x, box, cls


def one_cycle(y1=0.0, y2=1.0, steps=100):
    return lambda x: ((1 - math.cos(x * math.pi / steps)) / 2) * (y2 - y1) + y1


def make_opt(model, batch_size, bug=None):
    accumulate = max(round(NBS / batch_size), 1)
    wd = WD if bug == "weight_decay_not_scaled" else WD * batch_size * accumulate / NBS
    biases = [p for n, p in model.named_parameters() if n.endswith("bias")]
    bn_w = [model.bn.weight]
    weights = [p for n, p in model.named_parameters() if n.endswith("weight") and p is not model.bn.weight]
    opt = torch.optim.SGD(biases, lr=LR0, momentum=MOMENTUM, nesterov=True)
    opt.add_param_group({"params": weights, "weight_decay": wd})
    opt.add_param_group({"params": bn_w, "weight_decay": 0.0})
    lf = one_cycle(1, LRF, EPOCHS)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_lambda=lf)
    return opt, sched, lf, accumulate


def loop(model, params, opt, sched, lf, accumulate, batch_size, nb, rows, world, bug=None):
    """YOLOv5's epoch / iteration loop; ``rows(x)`` keeps the process's rows of a global batch."""
    nw = round(WARMUP_EPOCHS * nb)
    last_opt_step = -1
    opt.zero_grad()
    ni = -1
    for epoch in range(EPOCHS):
        for i in range(N_DATA // GB):
            ni += 1
            x, box, cls = (rows(t) for t in batch(ni))
            if ni <= nw:
                xi = [0, nw]
                accumulate = max(1, np.interp(ni, xi, [1, NBS / batch_size]).round())
                for j, grp in enumerate(opt.param_groups):
                    bias_group = 2 if bug == "bias_warmup_on_wrong_group" else 0
                    grp["lr"] = np.interp(ni, xi, [WARMUP_BIAS_LR if j == bias_group else 0.0,
                                                   grp["initial_lr"] * lf(epoch)])
                    if bug != "momentum_warmup_missing":
                        grp["momentum"] = np.interp(ni, xi, [WARMUP_MOMENTUM, MOMENTUM])
            pbox, pcls = model(x)
            bs = x.shape[0]
            loss = (F.mse_loss(pbox, box) + F.binary_cross_entropy_with_logits(pcls, cls)) * bs
            if world > 1 and bug != "loss_not_times_world":
                loss = loss * world
            loss.backward()
            if ni - last_opt_step >= accumulate:
                torch.nn.utils.clip_grad_norm_(params, max_norm=10.0)
                opt.step()
                opt.zero_grad()
                if bug != "last_opt_step_not_updated":
                    last_opt_step = ni
        sched.step()


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    r, w = rank(), world_size
    net = make_model()
    model = DDP(net)
    lb = GB // w
    opt, sched, lf, accumulate = make_opt(net, lb if bug == "accumulate_from_local_batch" else GB, bug)
    nb = N_DATA // lb if bug == "warmup_len_from_dataset_size" else N_DATA // GB
    loop(model, list(net.parameters()), opt, sched, lf, accumulate, lb if bug == "accumulate_from_local_batch" else GB,
         nb, lambda t: t[r * lb:(r + 1) * lb], w, bug)


def reference(world_size: int) -> None:
    model = make_model()
    opt, sched, lf, accumulate = make_opt(model, GB)
    loop(model, list(model.parameters()), opt, sched, lf, accumulate, GB, N_DATA // GB, lambda t: t, 1)
