"""RetinaNet-style dense detection head under DDP: per image a feature map, a shared conv tower, a
classification conv (A anchors x K classes, sigmoid logits, prior-probability bias) and a box conv (A x 4
deltas). Anchor targets are given (label in 0..K-1 for a positive anchor, -1 background, -2 ignored:
between the IoU thresholds), with box deltas for the positives; images have different numbers of
positives and some none. Losses: sigmoid focal loss (alpha 0.25, gamma 2) summed over the anchors not
ignored, against one-hot targets (all zero for background), and an L1 box loss summed over the positive
anchors; both divided by the number of positive anchors averaged over the ranks
(``reduce_mean(num_pos)``, clamped to at least 1 after the reduce), so that DDP's gradient average gives
the global sum over the global positives. SGD momentum. Variant ``sum_world``: the positives summed over
ranks (all-reduce) and the loss multiplied by the world size, the same value.

The one-device reference divides the global batch's sums by its total number of positives.

Follows pytorch/vision ``torchvision/models/detection/retinanet.py`` (``RetinaNetClassificationHead``:
prior-probability bias, ``gt_classes_target`` one-hot of the foreground anchors, ``valid_idxs_per_image
= matched_idxs_per_image != BETWEEN_THRESHOLDS``, ``sigmoid_focal_loss(..., reduction="sum") /
max(1, num_foreground)``; ``RetinaNetRegressionHead`` L1 on the foreground), ``torchvision/ops/focal_loss.py``
and open-mmlab/mmdetection ``mmdet/models/dense_heads/atss_head.py`` / ``fcos_head.py`` (``num_total_pos
= reduce_mean(torch.tensor(num_pos)).item(); max(num_total_pos, 1.0)``: the positives averaged over GPUs).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from .common import all_reduce, gen, rank

C_IN, HW, A, KC, GB, SEED, LR = 4, 4, 2, 3, 4, 43, 0.05
ALPHA, GAMMA = 0.25, 2.0
STEPS = 4
CORRECT = {"default": (2, 4), "sum_world": (2,)}
BUGS = {
    "numpos_local": "the loss is divided by the rank's own number of positive anchors (num_pos not all-reduced)",
    "numpos_sum_not_mean": "num_pos is all-reduced as a sum but not divided by the world size: the loss is W times too small",
    "clamp_before_reduce": "max(num_pos, 1) is taken on each rank before the all-reduce: a rank without positives adds 1",
    "numpos_counts_ignored": "num_pos counts the anchors not labelled background (labels != -1): ignored anchors counted as positives",
    "label_offset": "one-hot targets built as if class 0 were background (one_hot(labels, K + 1)[:, 1:]): class 0 lost, every other class shifted down by one",
    "box_on_all_anchors": "the box regression loss is summed over all anchors, not only the positive ones",
    "focal_mean_reduction": "sigmoid_focal_loss with reduction='mean' (over anchors and classes) and then divided by num_pos",
    "alpha_swapped": "the focal alpha weights the background terms (alpha_t = alpha * (1 - t) + (1 - alpha) * t)",
}
# positives per image: step 1's last two images have none (a rank with no positives at 2 ranks)
NPOS = [3, 1, 2, 4, 2, 5, 0, 0, 1, 3, 2, 2, 4, 0, 1, 3]


class Head(nn.Module):
    def __init__(self):
        super().__init__()
        self.tower = nn.Sequential(nn.Conv2d(C_IN, 8, 3, padding=1), nn.ReLU())
        self.cls = nn.Conv2d(8, A * KC, 3, padding=1)
        self.box = nn.Conv2d(8, A * 4, 3, padding=1)
        nn.init.constant_(self.cls.bias, -math.log((1 - 0.01) / 0.01))

    def forward(self, x):
        h = self.tower(x)
        n = x.shape[0]
        cls = self.cls(h).permute(0, 2, 3, 1).reshape(n, -1, KC)
        box = self.box(h).permute(0, 2, 3, 1).reshape(n, -1, 4)
        return cls, box


def data():
    """Images, anchor labels (K classes, -1 background, -2 ignored) and box deltas."""
    g = gen(SEED)
    n, na = STEPS * GB, HW * HW * A
    x = torch.randn(n, C_IN, HW, HW, generator=g)
    labels = torch.full((n, na), -1, dtype=torch.long)
    for i in range(n):
        order = torch.randperm(na, generator=g)
        labels[i, order[:NPOS[i]]] = torch.randint(0, KC, (NPOS[i],), generator=g)
        labels[i, order[NPOS[i]:NPOS[i] + 4]] = -2
    deltas = torch.randn(n, na, 4, generator=g) * 0.5
    return x, labels, deltas


def focal(logits, t, bug=None):
    p = torch.sigmoid(logits)
    ce = F.binary_cross_entropy_with_logits(logits, t, reduction="none")
    p_t = p * t + (1 - p) * (1 - t)
    loss = ce * (1 - p_t) ** GAMMA
    a_t = ALPHA * (1 - t) + (1 - ALPHA) * t if bug == "alpha_swapped" else ALPHA * t + (1 - ALPHA) * (1 - t)
    loss = a_t * loss
    return loss.mean() if bug == "focal_mean_reduction" else loss.sum()


def loss_sums(cls, box, labels, deltas, bug=None):
    """The classification and box losses summed over the images' anchors."""
    valid = labels != -2
    fg = labels >= 0
    if bug == "label_offset":
        t = F.one_hot(labels.clamp(min=0), KC + 1)[..., 1:].float()
    else:
        t = F.one_hot(labels.clamp(min=0), KC).float() * fg.unsqueeze(-1)
    l_cls = focal(cls[valid], t[valid], bug)
    sel = torch.ones_like(fg) if bug == "box_on_all_anchors" else fg
    l_box = F.l1_loss(box[sel], deltas[sel], reduction="sum")
    return l_cls, l_box, (labels != -1).sum() if bug == "numpos_counts_ignored" else fg.sum()


def build():
    torch.manual_seed(SEED)
    model = Head()
    return model, torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)


def normaliser(num_pos, world_size, bug, variant):
    n = num_pos.float()
    if bug == "numpos_local":
        return max(n.item(), 1.0)
    if bug == "clamp_before_reduce":
        n = n.clamp(min=1.0)
    total = all_reduce(n)
    if bug == "numpos_sum_not_mean" or variant == "sum_world":
        return max(total.item(), 1.0)
    return max(total.item() / world_size, 1.0)


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: its images; the sums divided by num_pos averaged over the ranks."""
    r, lb = rank(), GB // world_size
    model, opt = build()
    ddp = DDP(model)
    x, labels, deltas = data()
    for step in range(STEPS):
        rows = slice(step * GB + r * lb, step * GB + (r + 1) * lb)
        cls, box = ddp(x[rows])
        l_cls, l_box, num_pos = loss_sums(cls, box, labels[rows], deltas[rows], bug)
        loss = (l_cls + l_box) / normaliser(num_pos, world_size, bug, variant)
        if variant == "sum_world":
            loss = loss * world_size
        opt.zero_grad()
        loss.backward()
        opt.step()


def reference(world_size: int) -> None:
    """One device: the global batch's sums over its total number of positives."""
    model, opt = build()
    x, labels, deltas = data()
    for step in range(STEPS):
        rows = slice(step * GB, (step + 1) * GB)
        cls, box = model(x[rows])
        l_cls, l_box, num_pos = loss_sums(cls, box, labels[rows], deltas[rows])
        loss = (l_cls + l_box) / max(num_pos.item(), 1)
        opt.zero_grad()
        loss.backward()
        opt.step()
