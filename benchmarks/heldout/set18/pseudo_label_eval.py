"""Semi-supervised training with confidence-thresholded pseudo-labels from an eval-mode pass inside the
training loop, under DDP: an MLP with a batch norm over the global batch (heldout14's ``SyncBatchNorm1d``,
as ``nn.SyncBatchNorm`` would on GPUs) and dropout whose masks are drawn for the global batch. Every
update: ``model.eval()``, ``torch.no_grad()`` forward of the weakly augmented unlabelled rows,
``max_probs, targets_u = softmax(logits).max(-1)``, ``mask = max_probs >= TAU``, ``model.train()``
again; then the labelled cross entropy (mean over the global labelled batch, DDP's averaging) plus
``LAMBDA_U *`` the masked cross entropy of the strongly augmented rows against ``targets_u``, normalised
by the number of confident rows over all ranks (UDA's ``sum(loss * mask) / max(sum(mask), 1)`` with the
count all-reduced, each rank's sum times W so that DDP's averaging gives the global normalisation).
SGD Nesterov, cosine decay per update. Every random draw (data, both augmentations' noise, the dropout
masks) is made for the global batch by a generator seeded per update; each rank keeps its rows.

Follows kekmodel/FixMatch-pytorch ``train.py`` (``pseudo_label = torch.softmax(logits_u_w.detach() / T,
dim=-1)``, ``max_probs, targets_u = torch.max(pseudo_label, dim=-1)``, ``mask = max_probs.ge(threshold)``,
``Lu = (F.cross_entropy(logits_u_s, targets_u, reduction='none') * mask).mean()``,
``get_cosine_schedule_with_warmup``), google-research/uda ``main.py`` (confidence mask,
``loss_mask`` normalisation by its sum) and the eval-mode teacher pass of Noisy Student / the
pseudo-labelling examples (``model.eval()`` ... ``model.train()``).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from .common import SyncBatchNorm1d, all_reduce_sum, gen, rank

DI, H, C, GL, GU, SEED = 10, 32, 4, 8, 16, 1802
LR, MOMENTUM, TAU, LAMBDA_U, P = 0.15, 0.9, 0.5, 1.0, 0.2
STEPS = 8
CORRECT = {"default": (2, 4)}
BUGS = {
    "pseudo_labels_in_train_mode": "model.eval() is missing before the pseudo-label pass: the weak view is normalised with its batch statistics (and updates the running ones) and goes through dropout",
    "train_mode_not_restored": "model.train() is not called after the eval-mode pseudo-label pass: the whole training runs in eval mode (running statistics, no dropout)",
    "confident_count_local": "the masked unlabelled loss is normalised by the rank's own number of confident rows instead of the all-reduced count",
    "confident_count_not_times_world": "the masked unlabelled loss is divided by the global confident count but not multiplied by W: DDP's averaging makes the unlabelled term W times too small",
    "threshold_on_logits": "the confidence mask thresholds the raw logits (max logit >= TAU) instead of the softmax probabilities",
    "pseudo_labels_from_strong_view": "the pseudo-labels and the mask come from the strongly augmented view instead of the weak one",
    "strong_noise_seeded_per_rank": "each rank draws the strong augmentation's noise from its own rank-seeded generator instead of its rows of the global per-step draw",
}


class MaskDropout(nn.Module):
    """Dropout whose keep-mask is set from outside (the rank's rows of a global draw); identity in eval."""

    def __init__(self):
        super().__init__()
        self.mask = None

    def forward(self, x):
        return x * self.mask / (1 - P) if self.training else x


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.bn, self.drop, self.fc2, self.fc3 = (nn.Linear(DI, H), SyncBatchNorm1d(H), MaskDropout(),
                                                             nn.Linear(H, H), nn.Linear(H, C))

    def forward(self, x):
        h = self.drop(F.relu(self.bn(self.fc1(x))))
        return self.fc3(F.relu(self.fc2(h)))


def make_model():
    torch.manual_seed(SEED)
    return Net()


def batch(step: int):
    g = gen(SEED + step)
    yl = torch.randint(0, C, (GL,), generator=g)
    xl = torch.randn(GL, DI, generator=g) * 0.8 + F.one_hot(yl, DI).float() * 2.0
    yu = torch.randint(0, C, (GU,), generator=g)
    xu = torch.randn(GU, DI, generator=g) * 0.8 + F.one_hot(yu, DI).float() * 2.0
    weak = xu + 0.1 * torch.randn(GU, DI, generator=g)
    strong_noise = 0.6 * torch.randn(GU, DI, generator=g)
    keep = (torch.rand(GU, DI, generator=g) > 0.2).float()
    strong = (xu + strong_noise) * keep
    masks = {k: (torch.rand(n, H, generator=g) > P).float() for k, n in (("l", GL), ("u", GU), ("w", GU))}
    return xl, yl, weak, strong, xu, keep, masks


def make_opt(model):
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM, nesterov=True)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 0.5 * (1 + math.cos(math.pi * s / STEPS)))
    return opt, sched


def losses(model, net, xl, yl, weak, strong, ml, mu, mw, n_conf_fn, bug=None):
    """The labelled CE and the masked unlabelled CE sum with its normaliser (``n_conf_fn(mask)``)."""
    if bug != "pseudo_labels_in_train_mode":
        net.eval()
    with torch.no_grad():
        net.drop.mask = mw
        logits_w = model(strong if bug == "pseudo_labels_from_strong_view" else weak)
        probs = logits_w if bug == "threshold_on_logits" else torch.softmax(logits_w, -1)
        max_probs, targets_u = probs.max(-1)
        mask = (max_probs >= TAU).float()
    if bug != "train_mode_not_restored":
        net.train()
    net.drop.mask = ml
    lx = F.cross_entropy(model(xl), yl)
    net.drop.mask = mu
    lu_sum = (F.cross_entropy(model(strong), targets_u, reduction="none") * mask).sum()
    return lx, lu_sum, n_conf_fn(mask)


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    r, w = rank(), world_size
    net = make_model()
    model = DDP(net)
    opt, sched = make_opt(net)
    ll, lu = GL // w, GU // w
    for step in range(STEPS):
        xl, yl, weak, strong, xu, keep, masks = batch(step)
        if bug == "strong_noise_seeded_per_rank":
            g = gen(SEED * 7 + 100 * step + r)
            own = (xu[r * lu:(r + 1) * lu] + 0.6 * torch.randn(lu, DI, generator=g)) * keep[r * lu:(r + 1) * lu]
            strong = torch.cat([torch.zeros(r * lu, DI), own, torch.zeros(GU - (r + 1) * lu, DI)])
        sl, su = slice(r * ll, (r + 1) * ll), slice(r * lu, (r + 1) * lu)
        if bug == "confident_count_local":
            count = lambda m: m.sum().clamp(min=1.0) * w
        elif bug == "confident_count_not_times_world":
            count = lambda m: all_reduce_sum(m.sum()).clamp(min=1.0)
        else:
            count = lambda m: all_reduce_sum(m.sum()).clamp(min=1.0) / w
        lx, lu_sum, n = losses(model, net, xl[sl], yl[sl], weak[su], strong[su], masks["l"][sl], masks["u"][su],
                               masks["w"][su], count, bug)
        loss = lx + LAMBDA_U * lu_sum / n
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()


def reference(world_size: int) -> None:
    net = make_model()
    opt, sched = make_opt(net)
    for step in range(STEPS):
        xl, yl, weak, strong, xu, keep, masks = batch(step)
        lx, lu_sum, n = losses(net, net, xl, yl, weak, strong, masks["l"], masks["u"], masks["w"],
                               lambda m: m.sum().clamp(min=1.0))
        loss = lx + LAMBDA_U * lu_sum / n
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
