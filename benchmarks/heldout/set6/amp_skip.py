"""DDP with float16 ``autocast`` and a dynamic ``GradScaler`` whose first scales overflow: the first
steps are skipped (the scaler finds inf gradients, skips ``optimizer.step()`` and halves the scale)
until the scale fits. Per iteration: ``scaler.scale(loss).backward()``, ``scaler.unscale_(opt)``, clip
the true gradients' norm, ``scaler.step(opt)``, ``scaler.update()``; the ``OneCycleLR`` schedule is
stepped only when the optimizer really stepped (the scale did not go down), as the transformers
Trainer does (``optimizer_was_run``) and accelerate's ``AcceleratedScheduler`` (``step_was_skipped``).
``total_steps`` is the length of the rank's loader (``DistributedSampler``) times the epochs.

The one-device reference runs the ranks' blocks one after another under the same autocast (so the
float16 matmuls see the same shapes), backpropagates each block's scaled loss and divides the summed
gradients by W, as DDP averages them; then the same unscale, clip, step and update.

Follows the PyTorch AMP examples (``docs/source/notes/amp_examples.rst``: "Gradient clipping",
``scaler.unscale_`` before ``clip_grad_norm_``), ``torch/amp/grad_scaler.py`` (skip on inf,
``backoff_factor``), huggingface/transformers ``trainer.py`` (``optimizer_was_run = scale_before <=
scale_after``; the scheduler stepped only then) and the ``OneCycleLR`` docs (``total_steps =
epochs * steps_per_epoch``).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from .common import gen, rank

DIN, H, C, BATCH, ROWS_PER_RANK_EPOCH = 8, 16, 4, 8, 56
LR, MOMENTUM, MAX_NORM, INIT_SCALE, SEED = 0.2, 0.9, 0.5, 2.0 ** 20, 41
ITERS = 7  # one epoch of the rank's loader
STEPS = 4  # optimizer steps taken (the first 3 iterations overflow and are skipped)
CORRECT = {"default": (2,)}
BUGS = {
    "sched_on_skipped": "OneCycleLR stepped every iteration, also when the scaler skipped optimizer.step()",
    "scaler_per_step": "torch.amp.GradScaler() constructed inside the loop: the backoff is lost, every step overflows",
    "clip_before_unscale": "clip_grad_norm_ on the scaled gradients, then scaler.step (unscale_ after the clip)",
    "onecycle_total_dataset": "OneCycleLR total_steps from len(dataset) // batch_size, not the rank's loader length",
    "sched_before_step": "scheduler.step() called before scaler.step(optimizer), every iteration",
}


def make_model() -> nn.Module:
    return nn.Sequential(nn.Linear(DIN, H), nn.ReLU(), nn.Linear(H, H), nn.ReLU(), nn.Linear(H, C))


def global_batch(it: int, w: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = gen(900 + it)
    return torch.randn(BATCH * w, DIN, generator=g) * 3, torch.randint(0, C, (BATCH * w,), generator=g)


def scaler_new() -> torch.amp.GradScaler:
    return torch.amp.GradScaler("cpu", init_scale=INIT_SCALE, growth_interval=1000)


def update(model, opt, sched, scaler, bug: str | None) -> None:
    """Unscale, clip, step, update; the schedule stepped only after a step that ran."""
    if bug == "clip_before_unscale":
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
    else:
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
    if bug == "sched_before_step":
        sched.step()
    before = scaler.get_scale()
    scaler.step(opt)
    scaler.update()
    ran = before <= scaler.get_scale()
    if bug == "sched_on_skipped" or (ran and bug != "sched_before_step"):
        sched.step()


def make_opt(model, total_steps):
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    return opt, torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=LR, total_steps=total_steps)


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: DDP, its block of each global batch."""
    r, w = rank(), world_size
    torch.manual_seed(SEED)
    model = DDP(make_model())
    loader_len = ROWS_PER_RANK_EPOCH // BATCH
    total = (ROWS_PER_RANK_EPOCH * w) // BATCH if bug == "onecycle_total_dataset" else loader_len
    opt, sched = make_opt(model, total)
    scaler = scaler_new()
    for it in range(ITERS):
        if bug == "scaler_per_step":
            scaler = scaler_new()
        x, y = global_batch(it, w)
        opt.zero_grad()
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.cross_entropy(model(x.chunk(w)[r]), y.chunk(w)[r])
        scaler.scale(loss).backward()
        update(model, opt, sched, scaler, bug)


def reference(world_size: int) -> None:
    """One device: the blocks in rank order under the same autocast, gradients summed then divided by W."""
    w = world_size
    torch.manual_seed(SEED)
    model = make_model()
    opt, sched = make_opt(model, ROWS_PER_RANK_EPOCH // BATCH)
    scaler = scaler_new()
    for it in range(ITERS):
        x, y = global_batch(it, w)
        opt.zero_grad()
        for xb, yb in zip(x.chunk(w), y.chunk(w)):
            with torch.autocast("cpu", dtype=torch.float16):
                loss = F.cross_entropy(model(xb), yb)
            scaler.scale(loss).backward()
        for p in model.parameters():
            p.grad /= w
        update(model, opt, sched, scaler, None)
