"""Non-parametric instance discrimination with a memory bank (Wu et al. 2018) under DDP: an MLP encoder
whose outputs are L2-normalised, a memory bank (a buffer of N unit vectors, one per training instance,
random at the start); per step, a batch of instance indices and an augmentation noise, ``K`` negative
indices per sample, logits ``[f . bank[idx], f . bank[neg_1..K]] / T`` and cross-entropy with target 0;
after the optimizer step, the bank rows of the batch are updated ``bank[idx] <- normalize(m * bank[idx] +
(1 - m) * f)`` with the features and indices of the whole global batch (all-gathered, so that every rank's
bank stays the same). SGD with momentum. Every draw (the instance indices, the noise, the negative
indices) is made for the global batch by a generator seeded per step; each rank keeps its rows.

The one-device reference: the same step on the global batch with one bank.

Follows zhirongw/lemniscate.pytorch ``lib/NCEAverage.py`` / ``lib/LinearAverage.py`` (the memory
``self.memory``, ``idx.select(1, 0).copy_(y.data)`` puts the positive first, the update ``pos.mul_(momentum)
.add_(torch.mul(x.data, 1 - momentum))`` then ``pos.div(pos.pow(2).sum(1).pow(0.5))`` and
``index_copy_``), ``lib/normalize.py``, ``main.py`` (the dataset returns the instance ``index``), and
HobbitLong/CMC ``NCE/NCEAverage.py`` (the bank update after the loss); the all-gather of features and
indices follows the DDP ports of these banks (e.g. facebookresearch/vissl ``losses/nce_loss.py``).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from .common import all_gather_plain, gen, rank

DI, H, FD, N, GB, K, SEED = 12, 32, 16, 32, 8, 8, 2005
LR, MOM, T, M = 0.5, 0.9, 0.1, 0.75
STEPS = 6
CORRECT = {"default": (2, 4)}
BUGS = {
    "bank_update_local_only": "the memory bank is updated with the rank's own features and indices only (no all-gather): each rank's bank misses the other ranks' rows, so the banks (and the positives / negatives read from them) differ by rank",
    "negatives_seeded_per_rank": "the negative indices are drawn from a generator seeded with seed + rank for the rank's rows instead of the rank's rows of the global per-step draw",
    "bank_update_before_loss": "the bank rows are overwritten with the current features before the loss is computed: each positive is mostly the sample's own current feature",
    "momentum_on_wrong_side": "the bank update is written (1 - m) * bank + m * f: the momentum weights the new features instead of the memory",
    "bank_not_renormalized": "the updated bank rows are not re-normalised to unit length after the momentum mix",
    "instance_index_local": "each rank uses the position of a sample in its local batch (arange) as its instance index instead of the dataset index: the rows of all ranks read and write the same first bank entries",
    "features_not_normalized": "the encoder's outputs are not L2-normalised before the dot products with the bank",
}


def make_model():
    torch.manual_seed(SEED)
    return nn.Sequential(nn.Linear(DI, H), nn.ReLU(), nn.Linear(H, H), nn.ReLU(), nn.Linear(H, FD))


def init_bank():
    return F.normalize(torch.randn(N, FD, generator=gen(SEED + 1)), dim=1)


def data():
    return torch.randn(N, DI, generator=gen(SEED + 2))


def draws(step: int):
    g = gen(SEED + 100 * step)
    idx = torch.randperm(N, generator=g)[:GB]
    x = data()[idx] + 0.3 * torch.randn(GB, DI, generator=g)
    neg = torch.randint(0, N, (GB, K), generator=g)
    return idx, x, neg


def nce_loss(f, bank, idx, neg):
    pos = (f * bank[idx]).sum(1, keepdim=True)
    negs = torch.einsum("bd,bkd->bk", f, bank[neg])
    logits = torch.cat([pos, negs], 1) / T
    return F.cross_entropy(logits, torch.zeros(len(f), dtype=torch.long))


def update_bank(bank, idx, f, bug=None):
    with torch.no_grad():
        if bug == "momentum_on_wrong_side":
            rows = (1 - M) * bank[idx] + M * f
        else:
            rows = M * bank[idx] + (1 - M) * f
        if bug != "bank_not_renormalized":
            rows = F.normalize(rows, dim=1)
        bank.index_copy_(0, idx, rows)


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: DDP encoder, its rows, one bank kept equal on every rank by all-gathered updates."""
    r, w = rank(), world_size
    model = DDP(make_model())
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOM)
    bank = init_bank()
    lb = GB // w
    rows = slice(r * lb, (r + 1) * lb)
    for step in range(STEPS):
        idx, x, neg = draws(step)
        idx, x, neg = idx[rows], x[rows], neg[rows]
        if bug == "instance_index_local":
            idx = torch.arange(lb)
        if bug == "negatives_seeded_per_rank":
            neg = torch.randint(0, N, (lb, K), generator=gen(SEED + 7 * step + 1000 * (r + 1)))
        f = model(x)
        if bug != "features_not_normalized":
            f = F.normalize(f, dim=1)
        if bug == "bank_update_before_loss":
            update_bank(bank, torch.cat(list(all_gather_plain(idx[None]))), all_gather_plain(f))
        loss = nce_loss(f, bank, idx, neg)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if bug == "bank_update_before_loss":
            continue
        if bug == "bank_update_local_only":
            update_bank(bank, idx, f.detach(), bug)
        else:
            update_bank(bank, torch.cat(list(all_gather_plain(idx[None]))), all_gather_plain(f), bug)


def reference(world_size: int) -> None:
    """One device: the global batch, one bank."""
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOM)
    bank = init_bank()
    for step in range(STEPS):
        idx, x, neg = draws(step)
        f = F.normalize(model(x), dim=1)
        loss = nce_loss(f, bank, idx, neg)
        opt.zero_grad()
        loss.backward()
        opt.step()
        update_bank(bank, idx, f.detach())
