"""A float16 loop (CPU autocast) with a GradScaler whose first update overflows (its loss is 1e6 times the
others') and is skipped on both sides, under DDP
with two micro-batches per step (``reference=True``: one device, the global batch's micro-batches)."""
from __future__ import annotations

import contextlib

import torch
import torch.distributed as tdist
from torch import nn

DIM, HIDDEN, OUT, ROWS = 12, 32, 4, 16  # ROWS: the global batch


def batch(step: int):
    g = torch.Generator().manual_seed(300 + step)
    return torch.randn(ROWS, DIM, generator=g), torch.randn(ROWS, OUT, generator=g)


def fp16_scaled(world_size: int, bug: str = "", steps: int = 4, reference: bool = False) -> None:
    """Bugs on the ranks: ``zero_grad_micro`` (zero_grad before every micro-batch: only the last one's
    gradient is stepped); ``clip_scaled`` (clip_grad_norm_ before scaler.unscale_)."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(DIM, HIDDEN), nn.Tanh(), nn.Linear(HIDDEN, OUT))
    model = net if reference else nn.parallel.DistributedDataParallel(net)
    rank = 0 if reference else tdist.get_rank()
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
    for step in range(steps + 2):
        x, y = batch(step)
        shards = [(x, y)] if reference else [(x.chunk(world_size)[rank], y.chunk(world_size)[rank])]
        for i in range(2):
            if bug == "zero_grad_micro" and not reference:
                opt.zero_grad()
            xs = torch.cat([s[0].chunk(world_size if reference else 1)[r].chunk(2)[i]
                            for s in shards for r in range(world_size if reference else 1)])
            ys = torch.cat([s[1].chunk(world_size if reference else 1)[r].chunk(2)[i]
                            for s in shards for r in range(world_size if reference else 1)])
            quiet = model.no_sync() if not reference and i == 0 else contextlib.nullcontext()
            with quiet, torch.autocast("cpu", dtype=torch.float16):
                loss = nn.functional.mse_loss(model(xs).float(), ys) / 2 * (1e6 if step == 0 else 1.0)
            scaler.scale(loss).backward()
        if bug == "clip_scaled" and not reference:
            torch.nn.utils.clip_grad_norm_(net.parameters(), 0.5)
        else:
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(net.parameters(), 0.5)
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
