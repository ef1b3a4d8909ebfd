"""DDP with a hand-written gradient communication hook, the built-in ``allreduce_hook``, or a
``ZeroRedundancyOptimizer``; SGD with momentum and a ``StepLR``.

Follows pytorch/pytorch ``torch/distributed/algorithms/ddp_comm_hooks/default_hooks.py``
(``allreduce_hook``: ``bucket.buffer()`` divided by the group size, ``dist.all_reduce(...,
async_op=True).get_future()``, ``.then(lambda fut: fut.value()[0])``), the DDP communication hook docs
(``ddp.register_comm_hook(state, hook)``, ``GradBucket.is_last()``), and pytorch/tutorials
``recipes_source/zero_redundancy_optimizer.rst`` (``ZeroRedundancyOptimizer(ddp.parameters(),
optimizer_class=..., lr=...)``). A small ``bucket_cap_mb`` splits the MLP's gradients over several
buckets. Variants: the hand-written hook; ``default_hooks.allreduce_hook``; the hand-written hook with
``ZeroRedundancyOptimizer(SGD)``.
"""
from __future__ import annotations

import torch
import torch.distributed as tdist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from ..set1.common import block, rank, regress_rows

DIM, HID, OUT, GLOBAL_BATCH, LR, MOMENTUM = 12, 48, 6, 16, 0.05, 0.9
GPUS_PER_NODE = 8
STEPS = 6
CORRECT = {"default": (2, 4), "builtin": (2,), "zero": (2, 4)}
BUGS = {
    "hook_no_div": "the hand-written all-reduce hook sums the bucket and never divides by the world size",
    "hook_div_twice": "the hook divides before the all_reduce and again in its .then() callback",
    "hook_no_comm": "a debugging hook left registered: returns a completed future of the local bucket, no all_reduce",
    "hook_skip_last_bucket": "the hook skips the all_reduce for the last bucket ('too small to be worth it')",
    "hook_div_node_size": "the hook divides by a hard-coded GPUS_PER_NODE = 8 instead of the process group's size",
    "sched_rank0_only": "StepLR.step() inside the 'if rank == 0' logging block (with ZeroRedundancyOptimizer)",
}


def model() -> nn.Sequential:
    return nn.Sequential(nn.Linear(DIM, HID), nn.Tanh(), nn.Linear(HID, HID), nn.Tanh(), nn.Linear(HID, OUT))


def global_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    return regress_rows(31 + step, GLOBAL_BATCH, DIM, OUT)


def make_hook(bug: str | None):
    """The hand-written allreduce hook (default_hooks.allreduce_hook, written out), or a buggy one."""
    def hook(state, bucket):
        group = state if state is not None else tdist.group.WORLD
        world = tdist.get_world_size(group)
        buf = bucket.buffer()
        if bug == "hook_no_comm" or (bug == "hook_skip_last_bucket" and bucket.is_last()):
            fut = torch.futures.Future()
            fut.set_result(buf)
            return fut
        if bug == "hook_div_node_size":
            buf.div_(GPUS_PER_NODE)
        elif bug != "hook_no_div":
            buf.div_(world)
        fut = tdist.all_reduce(buf, group=group, async_op=True).get_future()
        if bug == "hook_div_twice":
            return fut.then(lambda f: f.value()[0].div_(world))
        return fut.then(lambda f: f.value()[0])
    return hook


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: DDP with the hook, SGD (or ZeRO over SGD), StepLR per step."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.distributed.optim import ZeroRedundancyOptimizer

    ddp = DDP(model(), bucket_cap_mb=0.004)
    if variant == "builtin":
        ddp.register_comm_hook(None, default_hooks.allreduce_hook)
    else:
        ddp.register_comm_hook(None, make_hook(bug))
    if variant == "zero" or bug == "sched_rank0_only":
        opt = ZeroRedundancyOptimizer(ddp.parameters(), optimizer_class=torch.optim.SGD, lr=LR, momentum=MOMENTUM)
    else:
        opt = torch.optim.SGD(ddp.parameters(), lr=LR, momentum=MOMENTUM)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    loss_fn = nn.MSELoss()
    for step in range(STEPS):
        x, y = (block(t, rank(), world_size) for t in global_batch(step))
        opt.zero_grad()
        loss = loss_fn(ddp(x), y)
        loss.backward()
        opt.step()
        if bug == "sched_rank0_only":
            if rank() == 0:
                sched.step()
        else:
            sched.step()


def reference(world_size: int) -> None:
    """One device: SGD on the global batch, the same StepLR."""
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
    loss_fn = nn.MSELoss()
    for step in range(STEPS):
        x, y = global_batch(step)
        opt.zero_grad()
        loss_fn(net(x), y).backward()
        opt.step()
        sched.step()
