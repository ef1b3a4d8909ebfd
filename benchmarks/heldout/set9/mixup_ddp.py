"""Mixup / CutMix under DDP with soft-target cross entropy: every rank loads the global batch, mixes it
(batch mode, drawn by a generator seeded the same on every rank: Mixup or CutMix chosen per batch with
``switch_prob`` 0.5, one ``lam`` per batch from ``Beta(alpha, alpha)``, the partner of row i the flipped
batch's row i; CutMix pastes a box from the flipped batch and corrects ``lam`` to the box's clipped
area; targets ``lam * onehot(y) + (1 - lam) * onehot(y.flip(0))`` with label smoothing) and keeps its
block of rows; a tiny conv net under DDP; ``SoftTargetCrossEntropy`` (mean over rows: DDP's average is
the global mean); SGD nesterov with weight decay. Variant ``gather``: each rank loads only its own rows
and all-gathers the batch (inputs and labels) before mixing it.

The one-device reference mixes the global batch of each step with the same draws.

Follows huggingface/pytorch-image-models ``timm/data/mixup.py`` (``Mixup._params_per_batch``,
``_mix_batch``: ``x_flipped = x.flip(0).mul_(1. - lam); x.mul_(lam).add_(x_flipped)``;
``cutmix_bbox_and_lam`` / ``rand_bbox`` with ``correct_lam``; ``mixup_target`` with ``off_value =
smoothing / num_classes``, ``y2 = one_hot(target.flip(0))``), ``timm/loss/cross_entropy.py``
(``SoftTargetCrossEntropy``: ``sum(-target * log_softmax(x), -1).mean()``) and timm ``train.py``
(mixup before the forward, ``SoftTargetCrossEntropy`` when mixup is active).
"""
from __future__ import annotations

import math

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from .common import all_gather, gen, rank

C, HW, N, GB, SEED = 5, 6, 32, 8, 37
ALPHA, CUT_ALPHA, SWITCH, SMOOTH, LR = 0.8, 1.0, 0.5, 0.1, 0.1
STEPS = 4   # N / GB
CORRECT = {"default": (2, 4), "gather": (2,)}
BUGS = {
    "lam_per_rank": "each rank draws its own lam from a generator seeded with seed + rank instead of the shared draw",
    "flip_local": "the batch is mixed after sharding: each rank's partner rows are the flip of its own rows, not of the global batch",
    "target_not_flipped": "mixup_target mixes one_hot(y) with one_hot(y) instead of one_hot(y.flip(0)): targets are not mixed",
    "lam_swapped": "the inputs are mixed with (1 - lam) on the original rows while the targets use lam",
    "double_smoothing": "nn.CrossEntropyLoss(label_smoothing=0.1) applied to the already smoothed soft targets",
    "cutmix_lam_uncorrected": "CutMix batches: the target lam is the drawn lam, not corrected to the clipped box's area",
}


def net() -> nn.Module:
    return nn.Sequential(nn.Conv2d(2, 4, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(4 * HW * HW, 16),
                         nn.ReLU(), nn.Linear(16, C))


def data():
    g = gen(SEED)
    x = torch.randn(N, 2, HW, HW, generator=g)
    y = (x.mean((1, 2))[:, :C] + 0.3 * torch.randn(N, C, generator=g)).argmax(1)
    return x, y


def one_hot(y, on, off):
    return torch.full((len(y), C), off).scatter_(1, y.view(-1, 1), on)


def mixup_target(y, lam, bug=None):
    off = SMOOTH / C
    on = 1.0 - SMOOTH + off
    y1 = one_hot(y, on, off)
    y2 = one_hot(y if bug == "target_not_flipped" else y.flip(0), on, off)
    return y1 * lam + y2 * (1.0 - lam)


def rand_bbox(rng, lam):
    ratio = math.sqrt(1 - lam)
    ch, cw = int(HW * ratio), int(HW * ratio)
    cy, cx = rng.randint(0, HW), rng.randint(0, HW)
    yl, yh = np.clip(cy - ch // 2, 0, HW), np.clip(cy + ch // 2, 0, HW)
    xl, xh = np.clip(cx - cw // 2, 0, HW), np.clip(cx + cw // 2, 0, HW)
    return int(yl), int(yh), int(xl), int(xh)


def mix_batch(x, y, rng, bug=None):
    """timm's batch-mode Mixup / CutMix on (x, y): the mixed inputs and the soft targets."""
    cutmix = rng.rand() < SWITCH
    lam = float(rng.beta(CUT_ALPHA, CUT_ALPHA) if cutmix else rng.beta(ALPHA, ALPHA))
    x = x.clone()
    if cutmix:
        yl, yh, xl, xh = rand_bbox(rng, lam)
        x[:, :, yl:yh, xl:xh] = x.flip(0)[:, :, yl:yh, xl:xh]
        if bug != "cutmix_lam_uncorrected":
            lam = 1.0 - (yh - yl) * (xh - xl) / float(HW * HW)
    else:
        a = 1.0 - lam if bug == "lam_swapped" else lam
        x = x * a + x.flip(0) * (1.0 - a)
    return x, mixup_target(y, lam, bug)


def soft_ce(out, target, bug=None):
    if bug == "double_smoothing":
        return nn.CrossEntropyLoss(label_smoothing=SMOOTH)(out, target)
    return torch.sum(-target * F.log_softmax(out, dim=-1), dim=-1).mean()


def build():
    torch.manual_seed(SEED)
    model = net()
    return model, torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9, nesterov=True, weight_decay=1e-4)


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: the global batch mixed with the shared draw, then its block of rows."""
    r, w = rank(), world_size
    model, opt = build()
    ddp = DDP(model)
    rng = np.random.RandomState(SEED + (r if bug == "lam_per_rank" else 0))
    xs, ys = data()
    lb = GB // w
    for step in range(STEPS):
        x, y = xs[step * GB:(step + 1) * GB], ys[step * GB:(step + 1) * GB]
        if bug == "flip_local":
            x, t = mix_batch(x[r * lb:(r + 1) * lb], y[r * lb:(r + 1) * lb], rng, bug)
        else:
            if variant == "gather":
                x, y = all_gather(x[r * lb:(r + 1) * lb]), all_gather(y[r * lb:(r + 1) * lb])
            x, t = mix_batch(x, y, rng, bug)
            x, t = x[r * lb:(r + 1) * lb], t[r * lb:(r + 1) * lb]
        loss = soft_ce(ddp(x), t, bug)
        opt.zero_grad()
        loss.backward()
        opt.step()


def reference(world_size: int) -> None:
    """One device: the global batch of each step mixed with the same draws."""
    model, opt = build()
    rng = np.random.RandomState(SEED)
    xs, ys = data()
    for step in range(STEPS):
        x, t = mix_batch(xs[step * GB:(step + 1) * GB], ys[step * GB:(step + 1) * GB], rng)
        loss = soft_ce(model(x), t)
        opt.zero_grad()
        loss.backward()
        opt.step()
