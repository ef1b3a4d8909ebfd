"""SimCLR under DDP with the NT-Xent loss over features all-gathered WITH autograd: two augmented views
of each sample (noise and feature dropout drawn for the GLOBAL batch by a seeded generator, sliced per
rank), an encoder with a projection head under DDP (both views in one forward), L2-normalised projections, the other ranks'
projections gathered by a ``GatherLayer`` (backward: the gathered gradient all-reduced, this rank's
slice kept), the rank's rows against all gathered rows: self-similarities masked out, the positive at
column ``rank * B + i`` of the cross-view block, cross entropy averaged over the rank's 2B rows (DDP's
average of the ranks' means is the global mean); SGD with momentum.

The one-device reference computes the same loss over the global batch (one "rank" holding every row).

Follows lightly-ai/lightly ``lightly/loss/ntx_ent_loss.py`` (``NTXentLoss`` with ``gather_distributed``:
``logits_00``/``logits_01``/``logits_10``/``logits_11`` against the gathered outputs, ``diag_mask`` at
``labels = arange(B) + rank * B``), ``lightly/utils/dist.py`` (``GatherLayer``: all-gather forward,
all-reduce then the rank's slice backward); Spijkervet/SimCLR ``simclr/modules/nt_xent.py`` and
``gather.py`` (whose first ``GatherLayer.backward`` returned ``grads[rank]`` without the all-reduce);
sthalles/SimCLR ``simclr.py`` (``info_nce_loss``: normalised features, the diagonal masked out).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from .common import all_gather, gather_grad, gen, rank

DIM, FEAT, PROJ, N, GB, SEED = 10, 16, 8, 32, 8, 43
TEMP, LR = 0.5, 0.3
STEPS = 4   # N / GB
CORRECT = {"default": (2, 4)}
BUGS = {
    "gather_no_grad": "the other ranks' projections are all-gathered without autograd (plain all_gather, the rank's own rows put back): their loss terms send no gradient back",
    "gather_bwd_no_reduce": "the GatherLayer's backward returns the rank's slice of its own gradient without all-reducing it first",
    "labels_no_offset": "the positives' labels are arange(B) without the rank * B offset into the gathered batch",
    "diag_not_masked": "the self-similarities (each row with itself) are not masked out of the logits",
    "no_l2_normalize": "the projections are not L2-normalised before the similarities",
    "views_local_draw": "every rank draws the augmentations for its own rows from the same seeded generator instead of slicing the global draw",
    "loss_sum": "the cross entropy is summed over the rank's rows (reduction='sum') instead of averaged",
}


class SimCLRNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(DIM, FEAT), nn.ReLU(), nn.Linear(FEAT, FEAT), nn.ReLU())
        self.projection_head = nn.Sequential(nn.Linear(FEAT, FEAT), nn.ReLU(), nn.Linear(FEAT, PROJ))

    def forward(self, x):
        return self.projection_head(self.encoder(x))


def data() -> torch.Tensor:
    return torch.randn(N, DIM, generator=gen(SEED))


def augment_draws(step: int, rows: int) -> list[torch.Tensor]:
    """The two views' random draws for ``rows`` rows: (noise, keep) of view 0, then of view 1."""
    g = gen(SEED + 300 + step)
    out = []
    for _ in range(2):
        out += [0.3 * torch.randn(rows, DIM, generator=g), (torch.rand(rows, DIM, generator=g) > 0.2).float()]
    return out


def views(x, d):
    """Additive noise and feature dropout: the two views of ``x``."""
    return (x + d[0]) * d[1], (x + d[2]) * d[3]


def ntxent(z0, z1, r, bug=None):
    """lightly's NTXentLoss on the rank's projections against the gathered ones."""
    if bug != "no_l2_normalize":
        z0, z1 = F.normalize(z0, dim=1), F.normalize(z1, dim=1)
    b = len(z0)
    if bug == "gather_no_grad":
        g0, g1 = all_gather(z0), all_gather(z1)
        g0 = torch.cat([g0[:r * b], z0, g0[(r + 1) * b:]])
        g1 = torch.cat([g1[:r * b], z1, g1[(r + 1) * b:]])
    else:
        g0, g1 = (gather_grad(z, bug != "gather_bwd_no_reduce") for z in (z0, z1))
    labels = torch.arange(b) + (0 if bug == "labels_no_offset" else r * b)
    l00, l01 = z0 @ g0.T / TEMP, z0 @ g1.T / TEMP
    l10, l11 = z1 @ g0.T / TEMP, z1 @ g1.T / TEMP
    if bug != "diag_not_masked":
        diag = F.one_hot(torch.arange(b) + r * b, len(g0)).bool()
        l00, l11 = l00[~diag].view(b, -1), l11[~diag].view(b, -1)
    logits = torch.cat([torch.cat([l01, l00], 1), torch.cat([l10, l11], 1)], 0)
    return F.cross_entropy(logits, labels.repeat(2), reduction="sum" if bug == "loss_sum" else "mean")


def build():
    torch.manual_seed(SEED)
    model = SimCLRNet()
    return model, torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: its block of each global batch, the global draw's rows of the two views."""
    r, w = rank(), world_size
    model, opt = build()
    ddp = DDP(model)
    xs, lb = data(), GB // w
    for step in range(STEPS):
        x = xs[step * GB:(step + 1) * GB][r * lb:(r + 1) * lb]
        d = augment_draws(step, lb) if bug == "views_local_draw" else \
            [t[r * lb:(r + 1) * lb] for t in augment_draws(step, GB)]
        z0, z1 = ddp(torch.cat(views(x, d))).chunk(2)
        loss = ntxent(z0, z1, r, bug)
        opt.zero_grad()
        loss.backward()
        opt.step()


def reference(world_size: int) -> None:
    """One device: the global batch, its two views, the loss with every row local."""
    model, opt = build()
    xs = data()
    for step in range(STEPS):
        z0, z1 = model(torch.cat(views(xs[step * GB:(step + 1) * GB], augment_draws(step, GB)))).chunk(2)
        loss = ntxent(z0, z1, 0)
        opt.zero_grad()
        loss.backward()
        opt.step()
