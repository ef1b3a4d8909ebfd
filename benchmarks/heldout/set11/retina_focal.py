"""A RetinaNet-style dense detection head under DDP: a shared conv tower, per-anchor class logits and box
deltas, anchors already matched to ground truth (foreground class ``0..C-1``, background ``-1``,
``-2`` between the IoU thresholds and ignored), the sigmoid focal loss (alpha 0.25, gamma 2) summed over
the anchors that are not ignored against one-hot targets (background a one-hot column dropped), an L1
box loss summed over the foreground anchors, both divided by the number of foreground anchors averaged
over ranks (``reduce_mean``, at least 1): with DDP's gradient average this is the global sum over the
global count. SGD with momentum. Images hold different numbers of foreground anchors, so the ranks'
counts differ. Variant ``reduce_sum``: the count all-reduced as a sum and the loss multiplied by the
world size (the same gradient).

The one-device reference: the global batch, the same loss with the global count.

Follows pytorch/vision ``torchvision/models/detection/retinanet.py``
(``RetinaNetClassificationHead.compute_loss``: ``foreground_idxs``, ``valid_idxs = matched_idxs !=
BETWEEN_THRESHOLDS``, ``sigmoid_focal_loss(..., reduction="sum") / max(1, num_foreground)``;
``RetinaNetRegressionHead.compute_loss``: L1 over the foreground), ``torchvision/ops/focal_loss.py``
(``sigmoid_focal_loss``), and open-mmlab/mmdetection ``mmdet/models/dense_heads/fcos_head.py`` /
``anchor_head.py`` (``num_pos = reduce_mean(...)``, ``max(num_pos, 1.0)``, ``avg_factor``; labels with
background index ``num_classes``).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from .common import all_reduce, gen, rank

CIN, HW, A, C, N, GB, SEED = 4, 4, 2, 3, 32, 8, 43
ALPHA, GAMMA, LR = 0.25, 2.0, 0.05
STEPS = 4   # N / GB
CORRECT = {"default": (2, 4), "reduce_sum": (2,)}
BUGS = {
    "num_pos_local": "the losses are divided by this rank's number of positive anchors, not the count averaged over ranks",
    "num_pos_summed": "the positive count is all-reduced as a sum (reduce_sum) where the mean over ranks belongs",
    "ignore_as_negative": "anchors between the IoU thresholds (ignored, -2) are kept in the focal loss as background",
    "alpha_swapped": "the focal alpha weights the negatives by alpha and the positives by 1 - alpha",
    "bbox_all_anchors": "the box regression loss is summed over every anchor, background included, not the foreground ones",
    "label_offset": "the one-hot class targets drop column 0 instead of the background column, shifting every class by one",
    "box_loss_mean": "the box loss is an element mean over the rank's positive anchors instead of a sum divided by the positive count",
}


class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.tower = nn.Sequential(nn.Conv2d(CIN, 8, 3, padding=1), nn.ReLU())
        self.cls_logits = nn.Conv2d(8, A * C, 3, padding=1)
        self.bbox_pred = nn.Conv2d(8, A * 4, 3, padding=1)

    def forward(self, x):
        f = self.tower(x)
        b = x.shape[0]
        cls = self.cls_logits(f).permute(0, 2, 3, 1).reshape(b, -1, C)
        box = self.bbox_pred(f).permute(0, 2, 3, 1).reshape(b, -1, 4)
        return cls, box


def data():
    """Features, matched labels per anchor (-2 ignore, -1 background, class) and box targets."""
    g = gen(SEED)
    x = torch.randn(N, CIN, HW, HW, generator=g)
    n_anchor = HW * HW * A
    fg_rate = torch.rand(N, 1, generator=g) * 0.4
    u = torch.rand(N, n_anchor, generator=g)
    labels = torch.randint(0, C, (N, n_anchor), generator=g)
    labels = torch.where(u < fg_rate, labels, torch.where(u < fg_rate + 0.15, torch.full_like(labels, -2),
                                                          torch.full_like(labels, -1)))
    boxes = torch.randn(N, n_anchor, 4, generator=g)
    return x, labels, boxes


def focal(logits, targets, bug=None):
    """torchvision's sigmoid focal loss, summed."""
    p = torch.sigmoid(logits)
    ce = F.binary_cross_entropy_with_logits(logits, targets, reduction="none")
    p_t = p * targets + (1 - p) * (1 - targets)
    loss = ce * (1 - p_t) ** GAMMA
    a = 1 - ALPHA if bug == "alpha_swapped" else ALPHA
    return ((a * targets + (1 - a) * (1 - targets)) * loss).sum()


def losses(cls, box, labels, boxes, bug=None):
    """(focal sum, box L1 sum) over the batch given, and its number of foreground anchors."""
    cls, box, labels, boxes = cls.reshape(-1, C), box.reshape(-1, 4), labels.reshape(-1), boxes.reshape(-1, 4)
    fg = labels >= 0
    valid = labels != -2 if bug != "ignore_as_negative" else torch.ones_like(fg)
    onehot = F.one_hot(torch.where(labels >= 0, labels, C), C + 1).float()
    target = onehot[:, 1:] if bug == "label_offset" else onehot[:, :C]
    loss_cls = focal(cls[valid], target[valid], bug)
    if bug == "bbox_all_anchors":
        loss_box = F.l1_loss(box, boxes, reduction="sum")
    elif bug == "box_loss_mean":
        loss_box = F.l1_loss(box[fg], boxes[fg])
    else:
        loss_box = F.l1_loss(box[fg], boxes[fg], reduction="sum")
    return loss_cls, loss_box, fg.sum().float()


def build():
    torch.manual_seed(SEED)
    model = Head()
    return model, torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9, weight_decay=1e-4)


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: its block of images, the losses over the count averaged over ranks."""
    r, w = rank(), world_size
    lb = GB // w
    model, opt = build()
    ddp = DDP(model)
    xs, ls, bs = data()
    for step in range(STEPS):
        sl = slice(step * GB + r * lb, step * GB + (r + 1) * lb)
        cls, box = ddp(xs[sl])
        loss_cls, loss_box, num_pos = losses(cls, box, ls[sl], bs[sl], bug)
        if bug == "num_pos_local":
            norm = num_pos.clamp(min=1.0)
        elif bug == "num_pos_summed" or variant == "reduce_sum":
            norm = all_reduce(num_pos).clamp(min=1.0)
        else:
            norm = (all_reduce(num_pos) / w).clamp(min=1.0)
        box_norm = 1.0 if bug == "box_loss_mean" else norm
        loss = loss_cls / norm + loss_box / box_norm
        if variant == "reduce_sum":
            loss = loss * w
        opt.zero_grad()
        loss.backward()
        opt.step()


def reference(world_size: int) -> None:
    """One device: the global batch over the global count."""
    model, opt = build()
    xs, ls, bs = data()
    for step in range(STEPS):
        sl = slice(step * GB, (step + 1) * GB)
        cls, box = model(xs[sl])
        loss_cls, loss_box, num_pos = losses(cls, box, ls[sl], bs[sl])
        norm = num_pos.clamp(min=1.0)
        loss = loss_cls / norm + loss_box / norm
        opt.zero_grad()
        loss.backward()
        opt.step()
