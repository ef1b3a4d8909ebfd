"""MoCo v2 under DDP: a query encoder trained by SGD and a key encoder updated as a momentum copy of it
(its parameters frozen to autograd, inside the optimizer's parameter list as MoCo's ``main_moco.py``
builds it over ``model.parameters()``), BatchNorm in both encoders (batch statistics: the rank's rows),
keys computed under ``no_grad`` after the batch shuffle across ranks (gather the key views, a permutation
shared by every rank, this rank's block of it, encode, gather the keys, ``argsort`` to undo the
shuffle), InfoNCE logits ``[q.k+, q.queue] / T`` with the positive at column 0, and a queue of negatives
refreshed after the loss with the keys of every rank (``concat_all_gather``, pointer advanced by the
global batch). Two views of each sample are drawn (noise) for the global batch and sliced per rank.

The one-device reference runs the global batch through the same module with each encoder's forward
split into ``world_size`` blocks (MoCo's one-GPU ``SplitBatchNorm`` trick), the same permutation and
the same queue refresh.

Follows facebookresearch/moco ``moco/builder.py`` (``MoCo._momentum_update_key_encoder``,
``_dequeue_and_enqueue``, ``_batch_shuffle_ddp``, ``_batch_unshuffle_ddp``, ``forward``,
``concat_all_gather``) and ``main_moco.py`` (``CrossEntropyLoss``, SGD momentum 0.9, weight decay).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from .common import all_gather, gen, rank, world

D, DIM, K, N, GB, SEED = 8, 8, 24, 32, 8, 41
M, T, LR = 0.9, 0.2, 0.1
STEPS = 4   # N / GB
CORRECT = {"default": (2, 4)}
BUGS = {
    "enqueue_local": "the queue is refreshed with this rank's keys only (no concat_all_gather before the enqueue)",
    "ptr_local": "the queue pointer advances by the rank's batch size, not the gathered batch size, so writes overlap",
    "shuffle_per_rank": "each rank draws its own shuffle permutation (no broadcast from rank 0), so keys are unshuffled to the wrong rows",
    "unshuffle_wrong": "the keys are 'unshuffled' with the shuffle permutation itself instead of its argsort",
    "momentum_swapped": "the momentum update uses k = (1 - m) k + m q instead of k = m k + (1 - m) q",
    "enqueue_before": "the current keys are enqueued before the negative logits are computed (each query meets its own positive among the negatives)",
    "normalize_dim0": "the queries are L2-normalised over the batch dimension (dim=0) instead of the feature dimension",
}


def encoder() -> nn.Module:
    return nn.Sequential(nn.Linear(D, 16), nn.BatchNorm1d(16, track_running_stats=False), nn.ReLU(), nn.Linear(16, DIM))


class MoCo(nn.Module):
    """Query and key encoders, the queue of keys. ``distributed``: the ranks' forward (shuffle across
    ranks, gathers); otherwise the one-device forward whose encoders run in ``splits`` blocks."""

    def __init__(self, distributed: bool, splits: int = 1):
        super().__init__()
        self.distributed, self.splits = distributed, splits
        self.encoder_q, self.encoder_k = encoder(), encoder()
        for pq, pk in zip(self.encoder_q.parameters(), self.encoder_k.parameters()):
            pk.data.copy_(pq.data)
            pk.requires_grad = False
        self.register_buffer("queue", F.normalize(torch.randn(DIM, K), dim=0))
        self.register_buffer("queue_ptr", torch.zeros(1, dtype=torch.long))

    @torch.no_grad()
    def momentum_update(self, bug=None):
        for pq, pk in zip(self.encoder_q.parameters(), self.encoder_k.parameters()):
            if bug == "momentum_swapped":
                pk.mul_(1.0 - M).add_(pq.detach() * M)
            else:
                pk.mul_(M).add_(pq.detach() * (1.0 - M))

    @torch.no_grad()
    def enqueue(self, keys, bug=None):
        n_this = keys.shape[0]
        if self.distributed and bug != "enqueue_local":
            keys = all_gather(keys)
        ptr = int(self.queue_ptr)
        self.queue[:, ptr:ptr + keys.shape[0]] = keys.T
        self.queue_ptr[0] = (ptr + (n_this if bug == "ptr_local" else keys.shape[0])) % K

    def split(self, enc, x):
        return torch.cat([enc(c) for c in x.chunk(self.splits)], 0)

    @torch.no_grad()
    def keys(self, im_k, idx_shuffle, bug=None):
        if not self.distributed:
            k = F.normalize(self.split(self.encoder_k, im_k[idx_shuffle]), dim=1)
            return k[torch.argsort(idx_shuffle)]
        r, w = rank(), world()
        x_all = all_gather(im_k)
        k = F.normalize(self.encoder_k(x_all[idx_shuffle.view(w, -1)[r]]), dim=1)
        idx_unshuffle = idx_shuffle if bug == "unshuffle_wrong" else torch.argsort(idx_shuffle)
        return all_gather(k)[idx_unshuffle.view(w, -1)[r]]

    def forward(self, im_q, im_k, idx_shuffle, bug=None):
        q = self.encoder_q(im_q) if self.distributed else self.split(self.encoder_q, im_q)
        q = F.normalize(q, dim=0 if bug == "normalize_dim0" else 1)
        self.momentum_update(bug)
        k = self.keys(im_k, idx_shuffle, bug)
        if bug == "enqueue_before":
            self.enqueue(k, bug)
        l_pos = torch.einsum("nc,nc->n", q, k).unsqueeze(-1)
        l_neg = torch.einsum("nc,ck->nk", q, self.queue.clone().detach())
        logits = torch.cat([l_pos, l_neg], 1) / T
        if bug != "enqueue_before":
            self.enqueue(k, bug)
        return logits, torch.zeros(logits.shape[0], dtype=torch.long)


def data():
    g = gen(SEED)
    return torch.randn(N, D, generator=g)


def views(x, step):
    """Two noisy views of the global batch of ``step`` (one draw for the whole batch)."""
    g = gen(SEED + 100 + step)
    return x + 0.3 * torch.randn(x.shape, generator=g), x + 0.3 * torch.randn(x.shape, generator=g)


def permutation(step, bug=None):
    """The batch-shuffle permutation of ``step``: drawn once, the same on every rank (broadcast)."""
    return torch.randperm(GB, generator=gen(SEED + 1000 + step + (17 * rank() if bug == "shuffle_per_rank" else 0)))


def build(distributed: bool, splits: int = 1):
    torch.manual_seed(SEED)
    model = MoCo(distributed, splits)
    return model, torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9, weight_decay=1e-4)


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: its block of both views, the shared permutation, InfoNCE, SGD."""
    r, lb = rank(), GB // world_size
    model, opt = build(True)
    ddp = DDP(model)
    xs = data()
    for step in range(STEPS):
        q_all, k_all = views(xs[step * GB:(step + 1) * GB], step)
        logits, labels = ddp(q_all[r * lb:(r + 1) * lb], k_all[r * lb:(r + 1) * lb], permutation(step, bug), bug)
        loss = F.cross_entropy(logits, labels)
        opt.zero_grad()
        loss.backward()
        opt.step()


def reference(world_size: int) -> None:
    """One device: the global batch, each encoder's forward in ``world_size`` blocks."""
    model, opt = build(False, world_size)
    xs = data()
    for step in range(STEPS):
        q_all, k_all = views(xs[step * GB:(step + 1) * GB], step)
        logits, labels = model(q_all, k_all, permutation(step))
        loss = F.cross_entropy(logits, labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
