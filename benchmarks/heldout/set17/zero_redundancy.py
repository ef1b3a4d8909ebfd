"""DDP with ``torch.distributed.optim.ZeroRedundancyOptimizer`` (optimizer_class ``Adam``): every rank holds
the Adam state of its shard of the parameters only, steps that shard and broadcasts it. The gradients
are averaged by DDP before the step, so the global-norm clip (``clip_grad_norm_`` over all parameters,
max norm 0.3, active on every step) sees the same full gradients on every rank; a ``CosineAnnealingLR``
(T_max = total updates, eta_min 1e-3) on the ZeRO optimizer is stepped after every update. A 3-layer MLP
regressing 4 targets (mean squared error). Every random draw is made for the global batch by a
generator seeded per step; each rank keeps its rows. The reference is plain ``Adam`` on one process with
the same clip and schedule. (Both the ZeRO step and its inner shard's ``Adam.step`` are optimizer steps
to a step hook; ``check.py`` keeps the outermost.)

Follows pytorch/pytorch ``torch/distributed/optim/zero_redundancy_optimizer.py`` (``step``:
``_sync_param_groups`` from the exposed ``param_groups`` to the local optimizer, then the shard's step and
the broadcast), the ZeRO tutorial (``recipes/zero_redundancy_optimizer``: ``DDP(model)`` +
``ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.Adam, lr=...)``), and the
sharded-clip code of fairscale ``optim/oss.py`` (``OSS.clip_grad_norm``: the local shard's norm to the
power p, all-reduced, then the root) and ``torch.distributed.fsdp`` ``clip_grad_norm_``.
"""
from __future__ import annotations

import torch
import torch.distributed as tdist
import torch.nn.functional as F
from torch import nn
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

from .common import gen, rank

GB, DI, DO, SEED = 8, 8, 4, 1704
LR, MAX_NORM, EPOCHS, PER_EPOCH = 2e-2, 0.3, 2, 3
STEPS = EPOCHS * PER_EPOCH
CORRECT = {"default": (2, 4)}
BUGS = {
    "clip_local_shard_norm": "the gradients are clipped by the norm of the rank's own ZeRO shard (optimizer.optim's parameters) instead of the global norm over all parameters",
    "clip_shard_norms_summed": "the global gradient norm is assembled by all-reducing (summing) the shards' norms instead of summing their squares and taking the root",
    "clip_after_step": "clip_grad_norm_ is called after optimizer.step(): the update uses the unclipped gradients",
    "clip_per_tensor": "each parameter tensor is clipped to max_norm on its own (clip_grad_norm_ in a loop) instead of one clip over the total norm",
    "cosine_t_max_in_epochs": "CosineAnnealingLR gets T_max in epochs while it is stepped per update: the learning rate reaches eta_min after 2 updates and climbs back",
    "scheduler_on_inner_optimizer": "the LR scheduler is attached to the ZeRO optimizer's local optimizer (optimizer.optim), whose lr ZeRO overwrites from its own param_groups on every step: the schedule never applies",
    "no_ddp_gradient_averaging": "the model is not wrapped in DDP (ZeRO assumed to synchronise gradients): each shard is stepped with its owner's local gradients",
}


def make_model():
    torch.manual_seed(SEED)
    return nn.Sequential(nn.Linear(DI, 32), nn.GELU(), nn.Linear(32, 32), nn.GELU(), nn.Linear(32, DO))


def batch(step: int):
    g = gen(SEED + step)
    x = torch.randn(GB, DI, generator=g)
    y = torch.sin(x[:, :DO] * 2.0) + 0.3 * torch.randn(GB, DO, generator=g)
    return x, y


def sharded_clip(local_params, how):
    grads = [p.grad for p in local_params if p.grad is not None]
    local = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(g) for g in grads])) if grads else torch.zeros(())
    if how == "local":
        total = local
    else:
        total = local.detach().clone()
        tdist.all_reduce(total)   # the sum of the shards' norms
    coef = (MAX_NORM / (total + 1e-6)).clamp(max=1.0)
    for g in grads:
        g.mul_(coef)


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    r, w = rank(), world_size
    model = make_model()
    net = model if bug == "no_ddp_gradient_averaging" else DDP(model)
    opt = ZeroRedundancyOptimizer(net.parameters(), optimizer_class=torch.optim.Adam, lr=LR)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(
        opt.optim if bug == "scheduler_on_inner_optimizer" else opt,
        T_max=EPOCHS if bug == "cosine_t_max_in_epochs" else STEPS, eta_min=1e-3)
    lb = GB // w
    for step in range(STEPS):
        x, y = batch(step)
        loss = F.mse_loss(net(x[r * lb:(r + 1) * lb]), y[r * lb:(r + 1) * lb])
        opt.zero_grad()
        loss.backward()
        if bug in ("clip_local_shard_norm", "clip_shard_norms_summed"):
            local = [p for g in opt.optim.param_groups for p in g["params"]]
            sharded_clip(local, "local" if bug == "clip_local_shard_norm" else "summed")
        elif bug == "clip_per_tensor":
            for p in model.parameters():
                torch.nn.utils.clip_grad_norm_([p], MAX_NORM)
        elif bug != "clip_after_step":
            torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
        opt.step()
        if bug == "clip_after_step":
            torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
        sched.step()


def reference(world_size: int) -> None:
    model = make_model()
    opt = torch.optim.Adam(model.parameters(), lr=LR)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=STEPS, eta_min=1e-3)
    for step in range(STEPS):
        x, y = batch(step)
        loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
        opt.step()
        sched.step()
