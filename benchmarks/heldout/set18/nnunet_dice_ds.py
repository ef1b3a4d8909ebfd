"""nnU-Net's loss under DDP: a tiny 2-D U-Net (conv / InstanceNorm / LeakyReLU, 3 resolutions, a
segmentation output per decoder resolution plus the bottleneck: deep supervision), ``DC_and_CE_loss``
(cross entropy + ``MemoryEfficientSoftDiceLoss(softmax, batch_dice=True, do_bg=False, smooth=1e-5,
ddp=True)``: the per-class intersection, predicted and ground-truth sums are all-gathered with
``AllGatherGrad``, whose backward all-reduces the gradient, and summed over the ranks, so the dice is
the global batch's), wrapped in ``DeepSupervisionWrapper`` with weights ``1 / 2**i``, the lowest
resolution's set to 1e-6 (DDP) and normalised to sum 1, targets downsampled with nearest-exact
interpolation. SGD Nesterov (momentum 0.99, weight decay 3e-5), ``clip_grad_norm_(12)``, the
``PolyLRScheduler`` (``initial_lr * (1 - step / max_steps) ** 0.9``) set from the update index before
each update. Every random draw is made for the global batch by a generator seeded per step; each rank
keeps its rows.

Follows MIC-DKFZ/nnUNet ``nnunetv2/training/loss/dice.py`` (``MemoryEfficientSoftDiceLoss``,
``AllGatherGrad.apply(intersect).sum(0)``), ``nnunetv2/utilities/ddp_allgather.py`` (``AllGatherGrad``,
after Lightning), ``loss/compound_losses.py`` (``DC_and_CE_loss``), ``loss/deep_supervision.py``,
``nnUNetTrainer.py`` (``_build_loss``: ``weights[-1] = 1e-6`` under DDP, ``weights / weights.sum()``;
``configure_optimizers``; ``on_train_epoch_start``: ``lr_scheduler.step(self.current_epoch)``;
``train_step``: ``clip_grad_norm_(..., 12)``) and ``lr_scheduler/polylr.py``.
"""
from __future__ import annotations

import torch
import torch.distributed as tdist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from .common import all_gather_plain, gen, rank, world

C, HW, GB, SEED = 3, 8, 8, 1805
LR, MOMENTUM, WD, SMOOTH = 0.05, 0.99, 3e-5, 1e-5
STEPS = 6
CORRECT = {"default": (2, 4)}
BUGS = {
    "dice_stats_not_gathered": "the batch dice's intersection / prediction / ground-truth sums are not all-gathered (ddp=False): each rank's dice is over its local batch only",
    "gather_without_grad": "the dice statistics are gathered with a plain dist.all_gather (the local slot put back with its gradient): the other ranks' terms get no gradient, the dice gradient is W times too small after DDP's averaging",
    "background_in_dice": "do_bg=True: the background class is included in the dice",
    "ds_weights_not_normalized": "the deep-supervision weights are not divided by their sum: the loss is 1.75 times too large",
    "ds_weights_reversed": "the deep-supervision weights are applied in reverse order: the lowest resolution output gets weight 1 and the full-resolution output 1e-6",
    "poly_lr_off_by_one": "the poly learning rate is set from the next update's index (step + 1): every update uses the following update's learning rate",
    "softmax_missing": "the dice loss is built without apply_nonlin (softmax): the soft dice is computed on the raw logits",
}


def block(i, o, stride=1):
    return nn.Sequential(nn.Conv2d(i, o, 3, stride, 1), nn.InstanceNorm2d(o, affine=True), nn.LeakyReLU(0.01))


class UNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.e1, self.e2, self.e3 = block(1, 6), block(6, 8, 2), block(8, 10, 2)
        self.up2, self.d2 = nn.ConvTranspose2d(10, 8, 2, 2), block(16, 8)
        self.up1, self.d1 = nn.ConvTranspose2d(8, 6, 2, 2), block(12, 6)
        self.s1, self.s2, self.s3 = nn.Conv2d(6, C, 1), nn.Conv2d(8, C, 1), nn.Conv2d(10, C, 1)

    def forward(self, x):
        a = self.e1(x)
        b = self.e2(a)
        c = self.e3(b)
        d2 = self.d2(torch.cat([self.up2(c), b], 1))
        d1 = self.d1(torch.cat([self.up1(d2), a], 1))
        return [self.s1(d1), self.s2(d2), self.s3(c)]           # highest resolution first


def make_model():
    torch.manual_seed(SEED)
    return UNet()


def batch(step: int):
    g = gen(SEED + step)
    y = torch.zeros(GB, HW, HW, dtype=torch.long)
    cy, cx = torch.randint(1, HW - 3, (GB,), generator=g), torch.randint(1, HW - 3, (GB,), generator=g)
    r = torch.randint(1, 4, (GB,), generator=g)
    ii, jj = torch.meshgrid(torch.arange(HW), torch.arange(HW), indexing="ij")
    for b in range(GB):
        box = (ii >= cy[b]) & (ii < cy[b] + r[b]) & (jj >= cx[b]) & (jj < cx[b] + r[b] + 1)
        y[b][box] = 1
        y[b][box & (ii == cy[b])] = 2
    x = y.float()[:, None] * 0.8 + torch.randn(GB, 1, HW, HW, generator=g)
    return x, y


class AllGatherGrad(torch.autograd.Function):
    @staticmethod
    def forward(ctx, t):
        return all_gather_plain(t[None])

    @staticmethod
    def backward(ctx, g):
        g = g.contiguous().clone()
        tdist.all_reduce(g)
        return g[tdist.get_rank()]


def gather_sum(t, bug=None):
    """nnU-Net's ``AllGatherGrad.apply(t).sum(0)`` (identity where no group is up)."""
    if world() == 1 or bug == "dice_stats_not_gathered":
        return t
    if bug == "gather_without_grad":
        parts = list(all_gather_plain(t[None]))
        parts[tdist.get_rank()] = t
        return torch.stack(parts).sum(0)
    return AllGatherGrad.apply(t).sum(0)


def soft_dice(x, y, bug=None):
    if bug != "softmax_missing":
        x = torch.softmax(x, 1)
    with torch.no_grad():
        onehot = F.one_hot(y, C).permute(0, 3, 1, 2).float()
    if bug != "background_in_dice":
        x, onehot = x[:, 1:], onehot[:, 1:]
    axes = [0, 2, 3]                                              # batch_dice
    intersect, sum_pred, sum_gt = (x * onehot).sum(axes), x.sum(axes), onehot.sum(axes)
    intersect, sum_pred, sum_gt = (gather_sum(t, bug) for t in (intersect, sum_pred, sum_gt))
    dc = (2 * intersect + SMOOTH) / torch.clip(sum_gt + sum_pred + SMOOTH, 1e-8)
    return -dc.mean()


def ds_weights(bug=None):
    w = torch.tensor([1 / 2 ** i for i in range(3)])
    w[-1] = 1e-6
    if bug != "ds_weights_not_normalized":
        w = w / w.sum()
    return w.flip(0) if bug == "ds_weights_reversed" else w


def ds_loss(outs, y, bug=None):
    total = 0.0
    for wt, out in zip(ds_weights(bug), outs):
        yt = F.interpolate(y.float()[:, None], size=out.shape[-2:], mode="nearest-exact")[:, 0].long()
        total = total + wt * (F.cross_entropy(out, yt) + soft_dice(out, yt, bug))
    return total


def make_opt(model):
    return torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM, nesterov=True, weight_decay=WD)


def set_poly_lr(opt, step):
    for g in opt.param_groups:
        g["lr"] = LR * (1 - step / STEPS) ** 0.9


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    r, w = rank(), world_size
    net = make_model()
    model = DDP(net)
    opt = make_opt(net)
    lb = GB // w
    for step in range(STEPS):
        set_poly_lr(opt, step + 1 if bug == "poly_lr_off_by_one" else step)
        x, y = batch(step)
        x, y = x[r * lb:(r + 1) * lb], y[r * lb:(r + 1) * lb]
        loss = ds_loss(model(x), y, bug)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 12)
        opt.step()


def reference(world_size: int) -> None:
    model = make_model()
    opt = make_opt(model)
    for step in range(STEPS):
        set_poly_lr(opt, step)
        x, y = batch(step)
        loss = ds_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 12)
        opt.step()
