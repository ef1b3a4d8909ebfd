"""Activation checkpointing (``torch.utils.checkpoint``) of residual blocks with dropout, under DDP;
SGD with momentum and a linear warm-up ``LambdaLR``.

Follows the ``torch.utils.checkpoint.checkpoint`` docs (``checkpoint(function, *args,
use_reentrant=False, preserve_rng_state=True)``; with ``use_reentrant=True`` "at least one of the
inputs needs to have requires_grad=True" or the segment's parameters get no gradient), Hugging Face
``modeling_utils.PreTrainedModel.gradient_checkpointing_enable`` (each layer called through
``self._gradient_checkpointing_func(layer.__call__, hidden_states, ...)``, and
``enable_input_require_grads`` for the embedding-input case) and pytorch/examples' DDP loops
(``DDP(model)``, ``loss.backward()``, ``optimizer.step()``, ``scheduler.step()`` after it). The dropout
draws its mask for the global batch from the global RNG (every rank and the reference seeded alike)
and keeps the rank's rows, so the one-device masks are the ranks' masks; checkpointing replays it on
recomputation only if the RNG state is preserved. The first segment (stem and first block) takes the
raw input. Variants: ``use_reentrant=False`` (default) and ``reentrant`` (``use_reentrant=True`` on every
segment, the first one's input marked ``requires_grad_()`` as ``enable_input_require_grads`` does).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.checkpoint import checkpoint

from .common import block, gen, rank

DIM, HID, OUT, GLOBAL_BATCH, P_DROP = 10, 24, 4, 16, 0.25
LR, MOMENTUM, WARMUP = 0.1, 0.9, 3
STEPS = 5
CORRECT = {"default": (2, 4), "reentrant": (2,)}
BUGS = {
    "reentrant_input_no_grad": "use_reentrant=True on the first segment whose input (the raw batch) does not require grad",
    "no_preserve_rng": "checkpoint(..., preserve_rng_state=False): the recomputation draws other dropout masks",
    "seed_per_rank": "torch.manual_seed(seed + rank) at the top: each rank draws other dropout masks",
    "loss_div_world": "the loss divided by the world size before backward ('DDP sums the gradients')",
    "lr_scaled_world": "lr multiplied by the world size though the global batch is fixed",
    "sched_before_step": "scheduler.step() called before optimizer.step(): the warm-up runs one step ahead",
}


class RowDropout(nn.Module):
    """Dropout whose mask is drawn for the global batch and sliced to this rank's rows."""

    def __init__(self, p: float) -> None:
        super().__init__()
        self.p, self.rows = p, None  # rows: (first row, global rows), set by the loop

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            return x
        start, total = self.rows
        keep = (torch.rand(total, x.shape[-1]) >= self.p)[start:start + x.shape[0]]
        return x * keep / (1 - self.p)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(HID)
        self.fc1, self.fc2 = nn.Linear(HID, HID), nn.Linear(HID, HID)
        self.drop = RowDropout(P_DROP)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return h + self.fc2(self.drop(F.gelu(self.fc1(self.norm(h)))))


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(DIM, HID)
        self.blocks = nn.ModuleList([Block() for _ in range(3)])
        self.head = nn.Linear(HID, OUT)
        self.checkpointing, self.reentrant, self.preserve = False, (False, False, False), True

    def set_rows(self, start: int, total: int) -> None:
        for b in self.blocks:
            b.drop.rows = (start, total)

    def first(self, x: torch.Tensor) -> torch.Tensor:
        return self.blocks[0](self.stem(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        segments = [self.first, self.blocks[1], self.blocks[2]]
        h = x
        for seg, reentrant in zip(segments, self.reentrant):
            if self.checkpointing:
                h = checkpoint(seg, h, use_reentrant=reentrant, preserve_rng_state=self.preserve)
            else:
                h = seg(h)
        return self.head(h)


def global_batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = gen(300 + step)
    return torch.randn(GLOBAL_BATCH, DIM, generator=g), torch.randn(GLOBAL_BATCH, OUT, generator=g)


def warmup(s: int) -> float:
    return min(1.0, (s + 1) / WARMUP)


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: checkpointed segments under DDP, its block of rows and of the dropout masks."""
    if bug == "seed_per_rank":
        torch.manual_seed(torch.initial_seed() + rank())
    net = Net()
    net.checkpointing = True
    net.preserve = bug != "no_preserve_rng"
    if variant == "reentrant":
        net.reentrant = (True, True, True)
    elif bug == "reentrant_input_no_grad":
        net.reentrant = (True, False, False)
    model = DDP(net, find_unused_parameters=bug == "reentrant_input_no_grad")
    lr = LR * world_size if bug == "lr_scaled_world" else LR
    opt = torch.optim.SGD(model.parameters(), lr=lr, momentum=MOMENTUM)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup)
    local = GLOBAL_BATCH // world_size
    net.set_rows(rank() * local, GLOBAL_BATCH)
    for step in range(STEPS):
        x, y = (block(t, rank(), world_size) for t in global_batch(step))
        if variant == "reentrant":
            x = x.requires_grad_()
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        if bug == "loss_div_world":
            loss = loss / world_size
        loss.backward()
        if bug == "sched_before_step":
            sched.step()
            opt.step()
        else:
            opt.step()
            sched.step()


def reference(world_size: int) -> None:
    """One device: no checkpointing, the global batch, the global dropout masks."""
    net = Net()
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, warmup)
    net.set_rows(0, GLOBAL_BATCH)
    for step in range(STEPS):
        x, y = global_batch(step)
        opt.zero_grad()
        F.mse_loss(net(x), y).backward()
        opt.step()
        sched.step()
