"""A torchvision-style CNN with BatchNorm under DDP: SGD with momentum, no weight decay on the norm
layers, MultiStepLR stepped per epoch, a validation pass after every epoch.

Follows pytorch/vision ``references/classification/train.py`` (``train_one_epoch`` starting with
``model.train()``, ``evaluate`` with ``model.eval()``, ``DistributedSampler`` with
``train_sampler.set_epoch(epoch)``, ``utils.set_weight_decay(..., norm_weight_decay=0.0)`` param
groups, ``torch.optim.lr_scheduler.MultiStepLR`` stepped once per epoch, ``args.lr`` as given) and
pytorch/examples ``imagenet/main.py`` (``args.batch_size = int(args.batch_size / ngpus_per_node)``).
SyncBatchNorm refuses CPU modules (``ValueError: SyncBatchNorm layers only work with GPU modules``),
so the ranks keep torchvision's default: plain BatchNorm, each rank normalizing its own rows. The one
device reference is the same math: it runs the global batch as the ranks' row blocks, each block
through the model on its own (batch statistics per block), the loss the mean of the blocks'.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

CLASSES, BATCH, LR, MOMENTUM, WD = 10, 4, 0.05, 0.9, 0.05
STEPS_PER_EPOCH = 2
STEPS = 6
MILESTONES, GAMMA = [1, 2], 0.5
CORRECT = {"default": (2, 4)}
BUGS = {
    "no_set_epoch": "train_sampler.set_epoch(epoch) never called: every epoch repeats epoch 0's shuffle",
    "sched_per_iter": "MultiStepLR (milestones in epochs) stepped after every iteration instead of every epoch",
    "eval_left_on": "train_one_epoch does not call model.train(): after the first validation BatchNorm runs in eval mode",
    "norm_decay": "optimizer built on model.parameters(): the norm_weight_decay=0 param groups never used",
    "batch_not_divided": "per-process batch size not divided by the number of processes (imagenet main.py's division forgotten)",
    "zero_grad_per_epoch": "optimizer.zero_grad() called once at the start of each epoch, not every iteration",
    "lr_scaled_world": "linear scaling rule applied on top: lr * world_size, though the batch given is already the global one",
}


def model() -> nn.Sequential:
    """A two-stage conv net with BatchNorm, torchvision-like, tiny."""
    return nn.Sequential(
        nn.Conv2d(3, 8, 3, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
        nn.Conv2d(8, 8, 3, stride=2, padding=1, bias=False), nn.BatchNorm2d(8), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, CLASSES))


def dataset(world_size: int) -> TensorDataset:
    """Images and labels: STEPS_PER_EPOCH global batches of BATCH rows per rank."""
    n = STEPS_PER_EPOCH * BATCH * world_size
    g = torch.Generator().manual_seed(4242)
    return TensorDataset(torch.randn(n, 3, 8, 8, generator=g), torch.randint(0, CLASSES, (n,), generator=g))


def val_rows() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(777)
    return torch.randn(8, 3, 8, 8, generator=g), torch.randint(0, CLASSES, (8,), generator=g)


def param_groups(net: nn.Module) -> list[dict]:
    """torchvision's set_weight_decay with norm_weight_decay=0.0: norm layers' parameters without decay."""
    norm, other = [], []
    for mod in net.modules():
        for p in mod.parameters(recurse=False):
            (norm if isinstance(mod, nn.modules.batchnorm._BatchNorm) else other).append(p)
    return [{"params": other, "weight_decay": WD}, {"params": norm, "weight_decay": 0.0}]


def evaluate(net: nn.Module) -> None:
    net.eval()
    with torch.inference_mode():
        x, _ = val_rows()
        net(x)


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: DDP(model), DistributedSampler, an epoch loop with validation."""
    net = model()
    ddp = DDP(net)
    lr = LR * world_size if bug == "lr_scaled_world" else LR
    params = net.parameters() if bug == "norm_decay" else param_groups(net)
    opt = torch.optim.SGD(params, lr=lr, momentum=MOMENTUM, weight_decay=WD)
    sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=MILESTONES, gamma=GAMMA)
    data = dataset(world_size)
    sampler = DistributedSampler(data, shuffle=True, seed=0)
    batch = BATCH * world_size if bug == "batch_not_divided" else BATCH
    loader = DataLoader(data, batch_size=batch, sampler=sampler)
    loss_fn = nn.CrossEntropyLoss()
    step, epoch = 0, 0
    while step < STEPS:
        if bug != "no_set_epoch":
            sampler.set_epoch(epoch)
        if bug != "eval_left_on" or epoch == 0:
            ddp.train()
        if bug == "zero_grad_per_epoch":
            opt.zero_grad()
        for x, y in loader:
            if bug != "zero_grad_per_epoch":
                opt.zero_grad()
            loss = loss_fn(ddp(x), y)
            loss.backward()
            opt.step()
            if bug == "sched_per_iter":
                sched.step()
            step += 1
            if step == STEPS:
                return
        if bug != "sched_per_iter":
            sched.step()
        evaluate(ddp)
        epoch += 1


def reference(world_size: int) -> None:
    """One device: the global batch of each step, each rank's rows normalized as a block of their own."""
    net = model()
    opt = torch.optim.SGD(param_groups(net), lr=LR, momentum=MOMENTUM, weight_decay=WD)
    sched = torch.optim.lr_scheduler.MultiStepLR(opt, milestones=MILESTONES, gamma=GAMMA)
    data = dataset(world_size)
    sampler = DistributedSampler(data, num_replicas=1, rank=0, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=BATCH * world_size, sampler=sampler)
    loss_fn = nn.CrossEntropyLoss()
    step, epoch = 0, 0
    while step < STEPS:
        sampler.set_epoch(epoch)
        net.train()
        for x, y in loader:
            opt.zero_grad()
            # rank r's rows of this batch are positions r, r + W, ... (DistributedSampler strides)
            losses = [loss_fn(net(x[r::world_size]), y[r::world_size]) for r in range(world_size)]
            torch.stack(losses).mean().backward()
            opt.step()
            step += 1
            if step == STEPS:
                return
        sched.step()
        epoch += 1
