"""Online hard example mining for semantic segmentation under DDP: a tiny fully convolutional net, a
per-pixel cross-entropy with class weights and an ignore index, and mmseg's threshold OHEM chosen over the
global batch. Without gradient, every rank computes the softmax probability of each pixel's ground-truth
class, all-gathers the probability maps and valid masks (fixed-size tensors), sorts the valid probabilities
of the whole global batch and takes ``threshold = max(sorted[min(min_kept * global_images, n - 1)],
thresh)``; a valid pixel is kept when its probability is below the threshold. The loss is the sum of the
kept pixels' weighted cross-entropies divided by the number of kept pixels of the global batch (all-reduced),
times the world size (DDP averages). SGD with momentum; each rank keeps its block of images.

The one-device reference: the same loop on the global batch.

Follows open-mmlab/mmsegmentation ``mmseg/structures/sampler/ohem_pixel_sampler.py`` (``OHEMPixelSampler.
sample``: ``batch_kept = self.min_kept * seg_label.size(0)``, ``valid_mask = seg_label !=
ignore_index``, the ignore label set to 0 on a clone before ``seg_prob.gather``, ``sort_prob[min(batch_kept,
sort_prob.numel() - 1)]``, ``threshold = max(min_threshold, self.thresh)``), ``mmseg/models/decode_heads/
decode_head.py`` (``loss_by_feat``: the sampler's ``seg_weight`` on the decode loss) and the mean over the
kept pixels of CoinCheung/BiSeNet ``lib/ohem_ce_loss.py`` (``OhemCELoss``). mmseg samples per rank; here the
threshold is chosen over the global batch, as the one-device run chooses it.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from .common import all_gather, all_reduce, gen, rank, world

C, HW, GB, SEED, IGNORE, MIN_KEPT, THRESH = 4, 6, 4, 147, 255, 10, 0.2
CLASS_WEIGHT = torch.tensor([1.0, 2.0, 0.5, 1.5])
STEPS = 6
CORRECT = {"default": (2, 4)}
BUGS = {
    "threshold_local": "the OHEM threshold is chosen from the rank's own pixels (local sort, min_kept times the local images)",
    "batch_kept_local": "the probabilities are sorted over the global batch but batch_kept is min_kept times the rank's local images",
    "kept_count_local": "the loss is divided by the rank's own kept-pixel count instead of the global kept count",
    "ignore_in_sort": "ignore-index pixels are not masked out of the sampler: they enter the sort, can be kept and are counted as kept",
    "prob_of_argmax": "the hardness is the probability of the predicted class (max softmax) instead of the ground-truth class's",
    "class_weights_dropped": "the per-pixel cross-entropy is computed without the class weights",
}


class FCN(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(SEED)
        self.body = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.ReLU(), nn.Conv2d(8, 8, 3, padding=1), nn.ReLU())
        self.cls = nn.Conv2d(8, C, 1)

    def forward(self, x):
        return self.cls(self.body(x))


def batch(step: int):
    g = gen(SEED + step)
    x = torch.randn(GB, 3, HW, HW, generator=g)
    label = (x[:, 0] + 0.5 * x[:, 1] + 0.5 * torch.randn(GB, HW, HW, generator=g) > 0).long()
    label = label + 2 * (x[:, 2] > 0.5).long()
    label[torch.rand(GB, HW, HW, generator=g) < 0.15] = IGNORE
    return x, label


@torch.no_grad()
def ohem_keep(logits, label, bug=None):
    """The kept-pixel mask (mmseg's threshold mode, the threshold over the global batch)."""
    valid = label != IGNORE
    if bug == "ignore_in_sort":
        valid = torch.ones_like(valid)
    prob = F.softmax(logits, 1)
    tmp = label.clone()
    tmp[tmp == IGNORE] = 0
    p = prob.max(1).values if bug == "prob_of_argmax" else prob.gather(1, tmp[:, None]).squeeze(1)
    images = label.shape[0]
    if bug == "threshold_local" or world() == 1:
        p_all, valid_all = p, valid
    else:
        p_all, valid_all = all_gather(p), all_gather(valid)
        images = images * world() if bug != "batch_kept_local" else images
    sort_prob = p_all[valid_all].sort().values
    batch_kept = MIN_KEPT * images
    threshold = max(float(sort_prob[min(batch_kept, sort_prob.numel() - 1)]), THRESH)
    return valid & (p < threshold)


def run(model, fwd, rows, w: int, bug=None) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    weight = None if bug == "class_weights_dropped" else CLASS_WEIGHT
    for step in range(STEPS):
        x, label = (rows(t) for t in batch(step))
        logits = fwd(x)
        kept = ohem_keep(logits, label, bug)
        ce = F.cross_entropy(logits, label, weight=weight, ignore_index=IGNORE, reduction="none")
        n_local = kept.sum().float()
        n = n_local if bug == "kept_count_local" else all_reduce(n_local)
        loss = (ce * kept).sum() / n * (1 if bug == "kept_count_local" else w)
        opt.zero_grad()
        loss.backward()
        opt.step()


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: the FCN under DDP, its block of images, the threshold over the global batch."""
    r, lb = rank(), GB // world_size
    model = FCN()
    run(model, DDP(model), lambda t: t[r * lb:(r + 1) * lb], world_size, bug)


def reference(world_size: int) -> None:
    """One device: the same loop on the global batch."""
    model = FCN()
    run(model, model, lambda t: t, 1)
