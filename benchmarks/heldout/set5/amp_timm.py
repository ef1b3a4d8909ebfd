"""timm-style training loop under DDP with automatic mixed precision: ``torch.autocast`` in float16
and a ``GradScaler`` (``torch.amp.GradScaler("cpu")`` here), gradient accumulation with ``no_sync`` on
all but the last micro-batch, ``scaler.unscale_`` before ``clip_grad_norm_``, ``scaler.step`` /
``scaler.update``, a learning rate scaled linearly with the global batch (``lr = base_lr *
global_batch / 256``), and a warm-up + cosine schedule stepped once per optimizer update, its lengths
in updates computed from the epoch's length over the global batch. Every rank reads its block of the
step's global rows.

Follows huggingface/pytorch-image-models ``train.py`` (``args.lr = args.lr_base * global_batch_size /
args.lr_base_size``; ``num_updates``-based ``lr_scheduler.step_update``; ``has_no_sync`` and
``model.no_sync()`` while accumulating; ``loss /= accum_steps``), ``timm/utils/cuda.py``
(``NativeScaler.__call__``: ``self._scaler.scale(loss).backward()``, ``self._scaler.unscale_
(optimizer)`` then ``dispatch_clip_grad``, ``self._scaler.step(optimizer)``, ``self._scaler.update()``)
and the PyTorch AMP examples (``docs/source/notes/amp_examples.rst``, "Working with Unscaled
Gradients").

The one-device loop accumulates over the W x ACCUM micro-batches of the ranks (each loss divided by
W x ACCUM), so its float16 matmuls see the same micro-batch shapes and the two runs agree to float32
roundoff (the scale and the divisions are powers of two).
"""
from __future__ import annotations

import math
from contextlib import nullcontext

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from .common import gen, rank

DIN, HID, CLASSES = 10, 32, 5
MICRO, ACCUM, UPDATES_PER_EPOCH, EPOCHS = 4, 2, 6, 2
BASE_LR, LR_BASE_SIZE, MOMENTUM, MAX_NORM, WARMUP_EPOCHS = 1.6, 256, 0.9, 0.5, 0.5
STEPS = 5
CORRECT = {"default": (2,)}
BUGS = {
    "clip_before_unscale": "clip_grad_norm_ called before scaler.unscale_: the scaled gradients are clipped",
    "backward_unscaled_loss": "scaled = scaler.scale(loss) then loss.backward(): the unscaled loss backpropagated, scaler.step still unscales",
    "sched_per_micro": "the warm-up/cosine scheduler stepped once per micro-batch instead of once per update",
    "warmup_not_scaled": "schedule lengths from the epoch over the per-rank batch (world size left out): warm-up W x too long",
    "lr_local_batch": "the learning rate scaled with the per-rank batch (base_lr * batch * accum / 256), not the global one",
    "no_sync_last_micro": "model.no_sync() on every micro-batch but the first: the last micro-batch's gradients never all-reduced",
}


def make_model() -> nn.Module:
    return nn.Sequential(nn.Linear(DIN, HID), nn.GELU(), nn.Linear(HID, HID), nn.GELU(), nn.Linear(HID, CLASSES))


def rows(step: int, w: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global rows of update ``step`` (MICRO x ACCUM x W of them)."""
    g = gen(900 + step)
    n = MICRO * ACCUM * w
    return torch.randn(n, DIN, generator=g), torch.randint(0, CLASSES, (n,), generator=g)


def schedule(opt, updates_per_epoch: int) -> torch.optim.lr_scheduler.LambdaLR:
    warm, total = max(1, int(WARMUP_EPOCHS * updates_per_epoch)), EPOCHS * updates_per_epoch

    def f(s: int) -> float:
        if s < warm:
            return (s + 1) / warm
        return 0.5 * (1 + math.cos(math.pi * (s - warm) / (total - warm)))
    return torch.optim.lr_scheduler.LambdaLR(opt, f)


def update(model, opt, scaler, micro_batches, divide, sync_ctx, bug, sched) -> None:
    """One optimizer update over ``micro_batches`` (timm's accumulation + NativeScaler)."""
    for m, (x, y) in enumerate(micro_batches):
        with sync_ctx(m), torch.autocast("cpu", dtype=torch.float16):
            loss = F.cross_entropy(model(x), y) / divide
        if bug == "backward_unscaled_loss":
            scaled = scaler.scale(loss)  # noqa: F841 - computed, then the wrong tensor backpropagated
            loss.backward()
        else:
            scaler.scale(loss).backward()
        if bug == "sched_per_micro":
            sched.step()
    if bug == "clip_before_unscale":
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
        scaler.unscale_(opt)
    else:
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
    scaler.step(opt)
    scaler.update()
    opt.zero_grad()
    if bug != "sched_per_micro":
        sched.step()


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: DDP, ACCUM micro-batches of its block per update."""
    r, w = rank(), world_size
    model = DDP(make_model())
    per_rank_batch = MICRO * ACCUM if bug == "lr_local_batch" else MICRO * ACCUM * w
    opt = torch.optim.SGD(model.parameters(), lr=BASE_LR * per_rank_batch / LR_BASE_SIZE, momentum=MOMENTUM)
    n_train = UPDATES_PER_EPOCH * MICRO * ACCUM * w
    upe = n_train // (MICRO * ACCUM * (1 if bug == "warmup_not_scaled" else w))
    sched = schedule(opt, upe)
    scaler = torch.amp.GradScaler("cpu")

    def sync_ctx(m: int):
        skip = m > 0 if bug == "no_sync_last_micro" else m < ACCUM - 1
        return model.no_sync() if skip else nullcontext()
    for step in range(STEPS):
        x, y = rows(step, w)
        x, y = x.chunk(w)[r], y.chunk(w)[r]
        update(model, opt, scaler, list(zip(x.chunk(ACCUM), y.chunk(ACCUM))), ACCUM, sync_ctx, bug, sched)


def reference(world_size: int) -> None:
    """One device: the same W x ACCUM micro-batches accumulated per update."""
    w = world_size
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=BASE_LR * MICRO * ACCUM * w / LR_BASE_SIZE, momentum=MOMENTUM)
    sched = schedule(opt, UPDATES_PER_EPOCH)
    scaler = torch.amp.GradScaler("cpu")
    for step in range(STEPS):
        x, y = rows(step, w)
        update(model, opt, scaler, list(zip(x.chunk(w * ACCUM), y.chunk(w * ACCUM))), w * ACCUM,
               lambda m: nullcontext(), None, sched)
