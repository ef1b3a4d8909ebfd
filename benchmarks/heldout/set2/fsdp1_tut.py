"""FSDP1 (``FullyShardedDataParallel``) on the FSDP tutorial's MNIST-style net.

Follows pytorch/tutorials ``intermediate_source/FSDP_tutorial.rst`` (``fsdp_mnist.py``): ``Net``
(two convs, max-pool, two Linear layers, ``log_softmax``), ``size_based_auto_wrap_policy``,
``model = FSDP(model, auto_wrap_policy=...)`` built before the optimizer,
``DistributedSampler(dataset, rank=rank, num_replicas=world_size, shuffle=True)``,
``StepLR(optimizer, step_size=1, gamma=args.gamma)`` stepped per epoch, ``sampler.set_epoch``;
FSDP1's own ``model.clip_grad_norm_`` as pytorch/examples ``distributed/FSDP/utils/train_utils.py``
warns. Differences: tiny 8x8 inputs, no dropout, ``nll_loss`` with the default mean reduction (the
tutorial sums it only for its printed loss), SGD with momentum in place of Adadelta, and
``sync_module_states`` left at its default (False: every rank builds the model from the same seed).
Variants: the three sharding strategies, with ``use_orig_params`` at its default (False: flat
parameters).
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from ..set1.common import reseed_apart

BATCH, LR, MOMENTUM, GAMMA, CLIP = 4, 0.05, 0.9, 0.7, 0.5
STEPS_PER_EPOCH = 2
STEPS = 6
CORRECT = {"default": (2, 4), "shard_grad_op": (2,), "no_shard": (2,)}
BUGS = {
    "no_sampler": "DataLoader(shuffle=True) without DistributedSampler: every rank draws from the whole data set",
    "sum_reduction": "nll_loss(reduction='sum') kept from the tutorial's logging line for the training loss",
    "optimizer_before_wrap": "optimizer built on model.parameters() before FSDP(model): it holds the pre-flattening parameters",
    "sched_per_batch": "StepLR(step_size=1) stepped after every batch instead of every epoch",
    "clip_local_shards": "torch.nn.utils.clip_grad_norm_ in place of model.clip_grad_norm_: the norm of each rank's local shard",
    "seed_apart": "torch.manual_seed(seed + rank) before building the model, sync_module_states left False",
}


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 4, 3, 1)
        self.conv2 = nn.Conv2d(4, 8, 3, 1)
        self.fc1 = nn.Linear(32, 32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.relu(self.conv2(x))
        x = torch.flatten(F.max_pool2d(x, 2), 1)
        return F.log_softmax(self.fc2(F.relu(self.fc1(x))), dim=1)


def dataset(world_size: int) -> TensorDataset:
    n = STEPS_PER_EPOCH * BATCH * world_size
    g = torch.Generator().manual_seed(31337)
    return TensorDataset(torch.randn(n, 1, 8, 8, generator=g), torch.randint(0, 10, (n,), generator=g))


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: the tutorial's fsdp_main, in short."""
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import ShardingStrategy
    from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy

    if bug == "seed_apart":
        reseed_apart()
    net = Net()
    if bug == "optimizer_before_wrap":
        opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM)
    strategy = {None: ShardingStrategy.FULL_SHARD, "shard_grad_op": ShardingStrategy.SHARD_GRAD_OP,
                "no_shard": ShardingStrategy.NO_SHARD}[variant]
    model = FSDP(net, auto_wrap_policy=functools.partial(size_based_auto_wrap_policy, min_num_params=100),
                 sharding_strategy=strategy, device_id=torch.device("cpu"))
    if bug != "optimizer_before_wrap":
        opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=GAMMA)
    data = dataset(world_size)
    if bug == "no_sampler":
        loader = DataLoader(data, batch_size=BATCH, shuffle=True, generator=torch.Generator().manual_seed(0))
        sampler = None
    else:
        sampler = DistributedSampler(data, shuffle=True, seed=0)
        loader = DataLoader(data, batch_size=BATCH, sampler=sampler)
    step, epoch = 0, 1
    while step < STEPS:
        model.train()
        if sampler is not None:
            sampler.set_epoch(epoch)
        for x, y in loader:
            opt.zero_grad()
            loss = F.nll_loss(model(x), y, reduction="sum" if bug == "sum_reduction" else "mean")
            loss.backward()
            if bug == "clip_local_shards":
                torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
            else:
                model.clip_grad_norm_(CLIP)
            opt.step()
            if bug == "sched_per_batch":
                sched.step()
            step += 1
            if step == STEPS:
                return
        if bug != "sched_per_batch":
            sched.step()
        epoch += 1


def reference(world_size: int) -> None:
    """One device: the same net on the global batch, the same sampler order with one replica."""
    net = Net()
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=GAMMA)
    data = dataset(world_size)
    sampler = DistributedSampler(data, num_replicas=1, rank=0, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=BATCH * world_size, sampler=sampler)
    step, epoch = 0, 1
    while step < STEPS:
        net.train()
        sampler.set_epoch(epoch)
        for x, y in loader:
            opt.zero_grad()
            F.nll_loss(net(x), y).backward()
            torch.nn.utils.clip_grad_norm_(net.parameters(), CLIP)
            opt.step()
            step += 1
            if step == STEPS:
                return
        sched.step()
        epoch += 1
