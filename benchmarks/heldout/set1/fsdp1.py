"""FSDP1: ``FullyShardedDataParallel`` with its default ``use_orig_params=False`` on CPU ranks.

Follows pytorch/tutorials ``intermediate_source/FSDP1_tutorial.rst`` (the MNIST example): a ``Net``
ending in ``log_softmax``, ``F.nll_loss``, ``DistributedSampler`` + ``set_epoch``, a
``size_based_auto_wrap_policy``, the optimizer built after wrapping, ``Adadelta(lr=1.0)`` and
``StepLR(step_size=1, gamma=0.7)`` stepped once per epoch; ``device_id=torch.device("cpu")`` here.
The one-device side is the ``pytorch/examples`` MNIST loop (mean loss), clipping with
``clip_grad_norm_`` where the FSDP side calls ``model.clip_grad_norm_``.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler

from .common import classify_table, reseed_apart

DIM, CLASSES, ROWS, GLOBAL_BATCH, EPOCHS, CLIP = 16, 4, 32, 8, 2, 0.5
STEPS = 6  # 4 steps per epoch: StepLR changes the lr at step 4
CORRECT = {"default": (2,)}
BUGS = {
    "optimizer_before_wrap": "the optimizer is built over model.parameters() before FSDP wraps the model",
    "reduction_sum": "the training loss uses F.nll_loss(..., reduction='sum') (as the tutorial's train does)",
    "steplr_per_batch": "StepLR(step_size=1) stepped after every batch instead of every epoch",
    "clip_local": "torch.nn.utils.clip_grad_norm_ on the FSDP1 flat shards instead of model.clip_grad_norm_",
    "seed_apart": "seed + rank before building the model, FSDP without sync_module_states=True",
}


class Net(nn.Module):
    """The tutorial's Net, as MLP layers: fc1, fc2, fc3, log_softmax."""

    def __init__(self):
        super().__init__()
        self.fc1, self.fc2, self.fc3 = nn.Linear(DIM, 32), nn.Linear(32, 32), nn.Linear(32, CLASSES)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.log_softmax(self.fc3(F.relu(self.fc2(F.relu(self.fc1(x))))), dim=1)


def _run(model, params_opt, loader, sampler, clip, bug=None) -> None:
    """The tutorial's epochs: set_epoch, nll_loss, backward, clip, step; StepLR per epoch."""
    opt = torch.optim.Adadelta(params_opt, lr=1.0)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.7)
    for epoch in range(EPOCHS):
        sampler.set_epoch(epoch)
        for x, y in loader:
            opt.zero_grad()
            loss = F.nll_loss(model(x), y, reduction="sum" if bug == "reduction_sum" else "mean")
            loss.backward()
            clip()
            opt.step()
            if bug == "steplr_per_batch":
                sched.step()
        if bug != "steplr_per_batch":
            sched.step()


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: FSDP1 with a size-based auto-wrap policy, Adadelta + StepLR."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy

    if bug == "seed_apart":
        reseed_apart()
    net = Net()
    early = list(net.parameters())
    policy = functools.partial(size_based_auto_wrap_policy, min_num_params=200)
    fsdp = FSDP(net, auto_wrap_policy=policy, device_id=torch.device("cpu"))
    ds = classify_table(4000, ROWS, DIM, CLASSES)
    sampler = DistributedSampler(ds, shuffle=True, seed=0)
    loader = DataLoader(ds, batch_size=GLOBAL_BATCH // world_size, sampler=sampler)
    if bug == "clip_local":
        clip = functools.partial(torch.nn.utils.clip_grad_norm_, list(fsdp.parameters()), CLIP)
    else:
        clip = functools.partial(fsdp.clip_grad_norm_, CLIP)
    params = early if bug == "optimizer_before_wrap" else fsdp.parameters()
    _run(fsdp, params, loader, sampler, clip, bug)


def reference(world_size: int) -> None:
    """One device: the same rows per step (one-replica sampler, global batch), mean loss."""
    net = Net()
    ds = classify_table(4000, ROWS, DIM, CLASSES)
    sampler = DistributedSampler(ds, num_replicas=1, rank=0, shuffle=True, seed=0)
    loader = DataLoader(ds, batch_size=GLOBAL_BATCH, sampler=sampler)
    clip = functools.partial(torch.nn.utils.clip_grad_norm_, list(net.parameters()), CLIP)
    _run(net, net.parameters(), loader, sampler, clip)
