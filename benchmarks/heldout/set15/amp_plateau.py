"""DDP with float16 ``autocast`` and ``torch.amp.GradScaler("cpu")`` (scale, backward, ``unscale_``,
clip the true gradients' norm, ``scaler.step``, ``scaler.update``), a classifier with dropout whose
masks are drawn for the global batch (a generator seeded per step; each rank keeps its rows), and a
validation pass inside the loop after every step: ``model.eval()``, ``torch.no_grad()``, the summed
validation loss and the row count all-reduced, ``model.train()`` again; ``ReduceLROnPlateau(patience=0)``
is stepped with the global mean validation loss. The validation set is split in contiguous, uneven
shards (``tensor_split`` at multiples of ``ceil(NV / W)``: 3 and 2 rows at 2 ranks, 2, 2, 1, 0 at 4),
the later rows mislabelled.

The one-device reference runs the ranks' blocks one after another under the same autocast (so the
float16 matmuls see the same shapes), backpropagates each block's scaled loss and divides the summed
gradients by W, as DDP averages them; the validation loss is the sum over the blocks over the count.

Follows the PyTorch AMP examples (``docs/source/notes/amp_examples.rst``: "Working with Unscaled
Gradients", ``scaler.unscale_(optimizer)`` before ``clip_grad_norm_``), pytorch/examples
``imagenet/main.py`` (``validate``: ``model.eval()``, ``torch.no_grad()``, the meters all-reduced with
``dist.all_reduce`` in ``AverageMeter.all_reduce``; ``scheduler.step()``), and the ``ReduceLROnPlateau``
docs (``scheduler.step(val_loss)``).
"""
from __future__ import annotations

import torch
import torch.distributed as tdist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from .common import gen, rank

D, H, C, GB, NV, SEED = 8, 32, 4, 16, 5, 171
LR, MOMENTUM, MAX_NORM, P = 0.8, 0.9, 0.5, 0.3
STEPS = 8
CORRECT = {"default": (2, 4)}
BUGS = {
    "val_loss_local": "ReduceLROnPlateau is stepped with the rank's own validation loss (not all-reduced): the ranks' learning rates differ",
    "val_rank0_only": "validation and scheduler.step(val_loss) run on rank 0 only: the other ranks never lower their learning rate",
    "train_mode_not_restored": "model.train() is not called after the validation pass: dropout stays off for the rest of training",
    "clip_after_step": "clip_grad_norm_ is called after scaler.step(optimizer): the step uses the unclipped gradients",
    "clip_before_unscale": "clip_grad_norm_ is applied to the scaled gradients, before scaler.unscale_ (inside scaler.step)",
    "plateau_on_train_loss": "ReduceLROnPlateau is stepped with the rank's training-batch loss instead of the validation loss",
    "dropout_mask_per_rank": "each rank draws its dropout masks from a rank-seeded generator instead of its rows of the global per-step draw",
}


class MaskDropout(nn.Module):
    """Dropout whose mask is set from outside (the rank's rows of the global draw); identity in eval."""

    def __init__(self):
        super().__init__()
        self.mask = None

    def forward(self, x):
        return x * self.mask / (1 - P) if self.training else x


def make_model() -> nn.Module:
    torch.manual_seed(SEED)
    return nn.Sequential(nn.Linear(D, H), nn.ReLU(), MaskDropout(), nn.Linear(H, H), nn.ReLU(), nn.Linear(H, C))


def draws(step: int):
    g = gen(SEED + step)
    y = torch.randint(0, C, (GB,), generator=g)
    x = torch.randn(GB, D, generator=g) + F.one_hot(y, D).float()
    return x, y, (torch.rand(GB, H, generator=g) > P).float()


def val_set():
    g = gen(SEED - 1)
    y = torch.randint(0, C, (NV,), generator=g)
    x = torch.randn(NV, D, generator=g) * 0.5 + F.one_hot(y, D).float()
    y[NV // 2 + 1:] = (y[NV // 2 + 1:] + 1) % C   # the later rows mislabelled: their loss grows as the model learns
    return x, y


def blocks(w: int, bug=None, r: int = 0):
    """The ranks' rows of the val set: contiguous, uneven (the last shard short, as a loader's last batch)."""
    cuts = [(NV + w - 1) // w * i for i in range(1, w)]
    return list(zip(*(t.tensor_split(cuts) for t in val_set())))


def scaler_new():
    return torch.amp.GradScaler("cpu", init_scale=2.0 ** 12)


def fwd_loss(model, x, y):
    with torch.autocast("cpu", dtype=torch.float16):
        return F.cross_entropy(model(x).float(), y)


def val_sums(model, rows):
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.float16):
        return sum(F.cross_entropy(model(x).float(), y, reduction="sum") for x, y in rows), sum(len(y) for _, y in rows)


def step_update(model, opt, scaler, bug=None):
    if bug == "clip_before_unscale":
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
    elif bug == "clip_after_step":
        scaler.unscale_(opt)
        scaler.step(opt)
        scaler.update()
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
        return
    else:
        scaler.unscale_(opt)
        torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM)
    scaler.step(opt)
    scaler.update()


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: DDP, its rows of every global batch and mask, its shard of the validation set."""
    r, w = rank(), world_size
    model = make_model()
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=LR, momentum=MOMENTUM)
    sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=0, threshold=0.0)
    scaler = scaler_new()
    lb, shard = GB // w, blocks(w)[r]
    for step in range(STEPS):
        x, y, mask = draws(step)
        mask = (torch.rand(lb, H, generator=gen(SEED * 7 + step * 13 + r)) > P).float() \
            if bug == "dropout_mask_per_rank" else mask[r * lb:(r + 1) * lb]
        model[2].mask = mask
        loss = fwd_loss(ddp, x[r * lb:(r + 1) * lb], y[r * lb:(r + 1) * lb])
        opt.zero_grad()
        scaler.scale(loss).backward()
        step_update(ddp, opt, scaler, bug)
        if bug == "val_rank0_only" and r != 0:
            continue
        model.eval()
        s, n = val_sums(model, [shard])
        if bug == "val_loss_local":
            val = s / n
        elif bug == "val_rank0_only":
            val = s / n
        elif bug == "plateau_on_train_loss":
            val = loss.detach()
        else:
            t = torch.tensor([s, float(n)])
            tdist.all_reduce(t)
            val = t[0] / t[1]
        if bug != "train_mode_not_restored":
            model.train()
        sched.step(float(val))


def reference(world_size: int) -> None:
    """One device: the ranks' blocks one after another under autocast, gradients summed / W."""
    w = world_size
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    sched = torch.optim.lr_scheduler.ReduceLROnPlateau(opt, factor=0.5, patience=0, threshold=0.0)
    scaler = scaler_new()
    lb, shards = GB // w, blocks(w)
    for step in range(STEPS):
        x, y, mask = draws(step)
        opt.zero_grad()
        for r in range(w):
            model[2].mask = mask[r * lb:(r + 1) * lb]
            scaler.scale(fwd_loss(model, x[r * lb:(r + 1) * lb], y[r * lb:(r + 1) * lb])).backward()
        for p in model.parameters():
            p.grad /= w
        step_update(model, opt, scaler)
        model.eval()
        s, n = 0.0, 0
        for shard in shards:
            a, b = val_sums(model, [shard])
            s, n = s + a, n + b
        model.train()
        sched.step(float(s / n))
