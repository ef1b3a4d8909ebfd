"""DDP communication hooks: a hand-written all-reduce hook and torch's ``bf16_compress_hook``.

The hand-written hook follows ``torch/distributed/algorithms/ddp_comm_hooks/default_hooks.py``
(``_allreduce_fut``: divide the bucket by the group size, ``all_reduce(async_op=True)``, return the
future's ``then``); the other variant registers ``default_hooks.bf16_compress_hook`` as the DDP
communication-hook docs show (``ddp.register_comm_hook(state=None, hook=...)``). SGD with momentum.
"""
import torch
import torch.distributed as tdist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from .common import block, classify_rows

DIM, CLASSES, GLOBAL_BATCH, LR = 16, 4, 8, 0.1
STEPS = 4
CORRECT = {"allreduce": (2, 4), "bf16": (2,)}
BUGS = {
    "hook_no_divide": "the hand-written all-reduce hook never divides by the world size",
    "hook_divide_twice": "the hook divides before the all-reduce and again in its then-callback",
    "bf16_manual_avg": "bf16_compress_hook registered, and the loop divides every grad by the world size again",
    "hook_skip_first": "the hook skips communication on the first iteration (a hand-rolled warm-up)",
}


class HookState:
    """What the hand-written hook needs: the bug flag and a count of finished iterations."""

    def __init__(self, bug):
        self.bug, self.iteration = bug, 0


def allreduce_hook(state: HookState, bucket) -> torch.futures.Future[torch.Tensor]:
    # (no ``from __future__ import annotations`` here: DDP checks this annotation's value)
    """Average the bucket over the default group (or not, under a bug)."""
    tensor, w = bucket.buffer(), tdist.get_world_size()
    skip = state.bug == "hook_skip_first" and state.iteration == 0
    if bucket.is_last():
        state.iteration += 1
    if skip:
        fut = torch.futures.Future()
        fut.set_result(tensor)
        return fut
    if state.bug != "hook_no_divide":
        tensor.div_(w)

    def done(fut):
        out = fut.value()[0]
        return out / w if state.bug == "hook_divide_twice" else out
    return tdist.all_reduce(tensor, async_op=True).get_future().then(done)


def model() -> nn.Sequential:
    """A 2-layer classifier."""
    return nn.Sequential(nn.Linear(DIM, 32), nn.Tanh(), nn.Linear(32, CLASSES))


def global_batch(step: int):
    """The global rows of a step."""
    return classify_rows(3000 + step, GLOBAL_BATCH, DIM, CLASSES)


def train(world_size: int, bug=None, variant=None) -> None:
    """Every rank: DDP with the chosen hook (``variant`` "allreduce" or "bf16"), SGD momentum."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

    variant = "bf16" if bug == "bf16_manual_avg" else variant or "allreduce"
    ddp = DDP(model())
    if variant == "bf16":
        ddp.register_comm_hook(state=None, hook=default_hooks.bf16_compress_hook)
    else:
        ddp.register_comm_hook(state=HookState(bug), hook=allreduce_hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=LR, momentum=0.9)
    for step in range(STEPS):
        x, y = (block(t, tdist.get_rank(), world_size) for t in global_batch(step))
        opt.zero_grad()
        F.cross_entropy(ddp(x), y).backward()
        if bug == "bf16_manual_avg":
            for p in ddp.parameters():
                p.grad.div_(world_size)
        opt.step()


def reference(world_size: int) -> None:
    """One device, the global batch."""
    net = model()
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=0.9)
    for step in range(STEPS):
        x, y = global_batch(step)
        opt.zero_grad()
        F.cross_entropy(net(x), y).backward()
        opt.step()
