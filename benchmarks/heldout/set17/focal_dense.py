"""A dense one-stage detection head (RetinaNet / FCOS-like) under DDP: per image ``A`` anchors with a
feature vector each, a shared trunk, a classification branch (``C`` sigmoid logits, the prior-probability
bias init ``-log((1 - 0.01) / 0.01)``) and a box-regression branch. Anchor labels follow detectron2's
convention (``0..C-1`` foreground, ``C`` background, ``-1`` ignored); the classification loss is the
sigmoid focal loss (alpha 0.25, gamma 2) summed over the non-ignored anchors with one-hot targets
``F.one_hot(labels, C + 1)[:, :-1]``, the box loss a smooth L1 (beta 0.1) summed over the positive
anchors. Both sums are divided by the loss normaliser: the number of positive anchors averaged over the
ranks (mmdet's ``reduce_mean``: all-reduced, divided by the world size), then an EMA (detectron2's
``_ema_update("loss_normalizer", max(num_pos, 1), initial 100, momentum 0.9)``). SGD with momentum.
Every random draw (features, anchor labels, box targets) is made for the global batch by a generator
seeded per step; each rank keeps its rows. The reference runs the global batch in one process with the
per-rank-average normaliser of the same definition (``global positives / world_size``) and the loss
divided by ``world_size`` once more (DDP's gradient averaging).

Follows facebookresearch/detectron2 ``modeling/meta_arch/retinanet.py`` (``RetinaNet.losses``:
``valid_mask = gt_labels >= 0``, ``pos_mask = (gt_labels >= 0) & (gt_labels != num_classes)``,
``F.one_hot(gt_labels, num_classes + 1)[:, :-1]``, ``_ema_update("loss_normalizer", ...)``),
``modeling/meta_arch/dense_detector.py`` (``_ema_update``), fvcore ``nn/focal_loss.py``
(``sigmoid_focal_loss``), and open-mmlab/mmdetection ``models/dense_heads/fcos_head.py`` /
``models/utils/misc.py`` (``num_pos = max(reduce_mean(num_pos), 1.0)``).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from .common import all_reduce_sum, gen, rank

GB, A, FD, C, SEED = 8, 16, 8, 3, 1705
LR, MOMENTUM, ALPHA, GAMMA, EMA_M, EMA_INIT = 0.5, 0.9, 0.25, 2.0, 0.9, 100.0
STEPS = 8
CORRECT = {"default": (2, 4)}
BUGS = {
    "num_pos_local": "the loss normaliser counts the rank's own positive anchors only (not all-reduced / averaged over the ranks)",
    "num_pos_summed_not_averaged": "the positive-anchor count is all-reduced (summed) but not divided by the world size: the normaliser is W times too large",
    "normalizer_ema_missing": "the loss is divided by the current step's positive count instead of its EMA (the loss_normalizer moving average is not used)",
    "pos_mask_includes_ignored": "the positive mask is labels != background without labels >= 0: ignored anchors (-1) count as positives in the normaliser and get a box loss",
    "focal_alpha_swapped": "the focal loss's alpha weighting is swapped: alpha weighs the negatives and 1 - alpha the positives",
    "box_loss_on_all_anchors": "the box regression loss is taken over every non-ignored anchor instead of the positive anchors only",
    "one_hot_wrong_slice": "the one-hot targets drop the first column ([:, 1:]) instead of the background column ([:, :-1]): the classes are shifted and background anchors get a positive target",
}


class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(FD, 16), nn.ReLU())
        self.cls_score = nn.Linear(16, C)
        self.bbox_pred = nn.Linear(16, 4)
        nn.init.constant_(self.cls_score.bias, -math.log((1 - 0.01) / 0.01))

    def forward(self, x):
        h = self.trunk(x)
        return self.cls_score(h), self.bbox_pred(h)


def make_model():
    torch.manual_seed(SEED)
    return Head()


def batch(step: int):
    g = gen(SEED + step)
    u = torch.rand(GB, A, generator=g)
    rate = torch.rand(GB, 1, generator=g) * 0.5          # images with few and with many objects
    cls = torch.randint(0, C, (GB, A), generator=g)
    labels = torch.where(u < rate, cls, torch.where(u < rate + 0.2, torch.full_like(cls, -1), torch.full_like(cls, C)))
    # ignored anchors overlap an object partly: they look like a weaker version of its class
    look = torch.where(labels == C, torch.full_like(cls, C), cls)
    scale = torch.where(labels == -1, 1.0, 2.0)[..., None]
    x = torch.randn(GB, A, FD, generator=g) + F.one_hot(look, FD).float() * scale
    boxes = torch.randn(GB, A, 4, generator=g) * 0.5
    return x, labels, boxes


def focal(logits, targets, bug=None):
    p = torch.sigmoid(logits)
    ce = F.binary_cross_entropy_with_logits(logits, targets, reduction="none")
    p_t = p * targets + (1 - p) * (1 - targets)
    loss = ce * (1 - p_t) ** GAMMA
    a = 1 - ALPHA if bug == "focal_alpha_swapped" else ALPHA
    return (a * targets + (1 - a) * (1 - targets)) * loss


def loss_sums(model, x, labels, boxes, bug=None):
    """The summed focal and box losses and the positive count of one batch."""
    cls, reg = model(x)
    cls, reg, labels, boxes = cls.reshape(-1, C), reg.reshape(-1, 4), labels.reshape(-1), boxes.reshape(-1, 4)
    valid = labels >= 0
    pos = (labels != C) if bug == "pos_mask_includes_ignored" else valid & (labels != C)
    onehot = F.one_hot(labels[valid], C + 1).float()
    target = onehot[:, 1:] if bug == "one_hot_wrong_slice" else onehot[:, :-1]
    cls_sum = focal(cls[valid], target, bug).sum()
    box_mask = valid if bug == "box_loss_on_all_anchors" else pos
    box_sum = F.smooth_l1_loss(reg[box_mask], boxes[box_mask], beta=0.1, reduction="sum")
    return cls_sum + box_sum, float(pos.sum())


class Normalizer:
    """detectron2's ``_ema_update`` of the loss normaliser."""

    def __init__(self):
        self.value = EMA_INIT

    def __call__(self, num_pos: float, bug=None) -> float:
        if bug == "normalizer_ema_missing":
            return max(num_pos, 1.0)
        self.value = EMA_M * self.value + (1 - EMA_M) * max(num_pos, 1.0)
        return self.value


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    r, w = rank(), world_size
    model = make_model()
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=LR, momentum=MOMENTUM)
    norm = Normalizer()
    lb = GB // w
    for step in range(STEPS):
        x, labels, boxes = (t[r * lb:(r + 1) * lb] for t in batch(step))
        s, num_pos = loss_sums(ddp, x, labels, boxes, bug)
        if bug != "num_pos_local":
            num_pos = float(all_reduce_sum(torch.tensor(num_pos)))
            if bug != "num_pos_summed_not_averaged":
                num_pos = num_pos / w
        loss = s / norm(num_pos, bug)
        opt.zero_grad()
        loss.backward()
        opt.step()


def reference(world_size: int) -> None:
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    norm = Normalizer()
    for step in range(STEPS):
        s, num_pos = loss_sums(model, *batch(step))
        loss = s / (norm(num_pos / world_size) * world_size)
        opt.zero_grad()
        loss.backward()
        opt.step()
