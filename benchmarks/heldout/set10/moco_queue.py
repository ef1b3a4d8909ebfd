"""MoCo v2 under DDP: a query encoder (MLP with BatchNorm) trained by SGD, a momentum key encoder
(``param_k = m * param_k + (1 - m) * param_q`` before the keys are computed, no gradient), keys made
with the batch shuffled over all ranks for BatchNorm (``_batch_shuffle_ddp``: all-gather, a random
permutation drawn on rank 0 and broadcast, each rank keeps its block; ``_batch_unshuffle_ddp`` restores
the order), L2-normalised, InfoNCE against the positive key (column 0) and a queue of negatives, and the
queue filled with the keys of all ranks (``concat_all_gather``) at the pointer, which moves by the global
batch. The two views are drawn for the global batch by a generator seeded the same on every rank; each
rank keeps its block of rows. The whole MoCo module is wrapped in DDP (the key encoder's parameters do
not require gradients; the optimizer is built over ``model.parameters()`` as in ``main_moco.py``).

The one-device reference runs the same model on the global batch; its BatchNorm sees the rank-sized
blocks a rank would see (the query encoder is run per block, the shuffled keys per block), so each step
is the distributed step's computation in one process.

Follows facebookresearch/moco ``moco/builder.py`` (``MoCo._momentum_update_key_encoder``,
``_dequeue_and_enqueue``, ``_batch_shuffle_ddp``, ``_batch_unshuffle_ddp``, ``forward``,
``concat_all_gather``) and ``main_moco.py`` (SGD momentum 0.9, weight decay, ``CrossEntropyLoss`` on the
logits / labels the model returns); open-mmlab/mmselfsup ``mmselfsup/models/utils/batch_shuffle.py``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from .common import all_gather, broadcast, gen, rank

D_IN, DIM, K, GB, SEED = 8, 6, 16, 8, 41
M, T, LR = 0.9, 0.2, 0.3
STEPS = 4
CORRECT = {"default": (2, 4)}
BUGS = {
    "enqueue_local": "the queue is filled with the rank's own keys only (no concat_all_gather before the enqueue)",
    "ptr_local_batch": "the queue pointer moves by the rank's batch size while all ranks' keys are written",
    "no_unshuffle": "the keys are not unshuffled after the shuffled key forward: positives paired with other rows' keys",
    "shuffle_per_rank": "each rank draws its own shuffle permutation (seeded by rank) instead of rank 0's broadcast one",
    "no_shuffle_bn": "the batch is not shuffled for the key encoder: its BatchNorm sees the rank's own rows",
    "momentum_swapped": "the momentum update is written param_k = (1 - m) * param_k + m * param_q",
    "labels_rank_offset": "the positive's label is the row's global index (rank * B + i, copied from CLIP/SimCLR code) instead of 0",
}


def encoder() -> nn.Module:
    return nn.Sequential(nn.Linear(D_IN, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, DIM))


class MoCo(nn.Module):
    """Query and momentum key encoders and the queue of negative keys. ``blocks`` > 0: one process
    stands for that many ranks (BatchNorm per block, the shuffle done on the whole batch)."""

    def __init__(self, blocks: int = 0, bug: str | None = None):
        super().__init__()
        self.blocks, self.bug = blocks, bug
        self.encoder_q, self.encoder_k = encoder(), encoder()
        for pq, pk in zip(self.encoder_q.parameters(), self.encoder_k.parameters()):
            pk.data.copy_(pq.data)
            pk.requires_grad = False
        self.register_buffer("queue", F.normalize(torch.randn(DIM, K, generator=gen(SEED + 1)), dim=0))
        self.register_buffer("queue_ptr", torch.zeros(1, dtype=torch.long))

    @torch.no_grad()
    def momentum_update(self) -> None:
        for pq, pk in zip(self.encoder_q.parameters(), self.encoder_k.parameters()):
            if self.bug == "momentum_swapped":
                pk.mul_(1.0 - M).add_(pq.detach() * M)
            else:
                pk.mul_(M).add_(pq.detach() * (1.0 - M))

    @torch.no_grad()
    def enqueue(self, k: torch.Tensor) -> None:
        keys = k if self.bug == "enqueue_local" else self.gather(k)
        ptr = int(self.queue_ptr)
        n = keys.shape[0]
        self.queue[:, (ptr + torch.arange(n)) % K] = keys.T
        step = k.shape[0] if self.bug in ("ptr_local_batch", "enqueue_local") else n
        self.queue_ptr[0] = (ptr + step) % K

    def gather(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.blocks else all_gather(x)

    def run(self, enc: nn.Module, x: torch.Tensor) -> torch.Tensor:
        if not self.blocks:
            return enc(x)
        return torch.cat([enc(c) for c in x.chunk(self.blocks, 0)], 0)

    @torch.no_grad()
    def keys(self, im_k: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
        """The key encoder's normalised keys of ``im_k``, BatchNorm run on shuffled blocks."""
        if self.bug == "no_shuffle_bn":
            return F.normalize(self.run(self.encoder_k, im_k), dim=1)
        x_all = self.gather(im_k)
        b, n = im_k.shape[0], x_all.shape[0]
        unshuffle = torch.argsort(perm)
        if self.blocks:
            k = F.normalize(self.run(self.encoder_k, x_all[perm]), dim=1)
            return k if self.bug == "no_unshuffle" else k[unshuffle]
        mine = perm.view(n // b, -1)[rank()]
        k = F.normalize(self.encoder_k(x_all[mine]), dim=1)
        if self.bug == "no_unshuffle":
            return k
        return all_gather(k)[unshuffle.view(n // b, -1)[rank()]]

    def forward(self, im_q: torch.Tensor, im_k: torch.Tensor, perm: torch.Tensor):
        q = F.normalize(self.run(self.encoder_q, im_q), dim=1)
        with torch.no_grad():
            self.momentum_update()
            k = self.keys(im_k, perm)
        l_pos = torch.einsum("nc,nc->n", q, k).unsqueeze(-1)
        l_neg = torch.einsum("nc,ck->nk", q, self.queue.clone().detach())
        logits = torch.cat([l_pos, l_neg], 1) / T
        labels = torch.zeros(len(q), dtype=torch.long)
        if self.bug == "labels_rank_offset":
            labels = torch.arange(len(q)) + rank() * len(q)
        self.enqueue(k)
        return logits, labels


def views():
    """Two noisy views of each sample, every step's global batch."""
    g = gen(SEED)
    base = torch.randn(STEPS * GB, D_IN, generator=g)
    v1 = base + 0.3 * torch.randn(base.shape, generator=g)
    v2 = base * (1 + 0.2 * torch.randn(base.shape, generator=g)) + 0.3 * torch.randn(base.shape, generator=g)
    return v1, v2


def perms(bug=None):
    g = gen(SEED + 2 + (rank() if bug == "shuffle_per_rank" else 0))
    return [torch.randperm(GB, generator=g) for _ in range(STEPS)]


def build(blocks=0, bug=None):
    torch.manual_seed(SEED)
    model = MoCo(blocks, bug)
    return model, torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9, weight_decay=1e-4)


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: its block of the two views; shuffle permutation from rank 0; keys of all ranks queued."""
    r, lb = rank(), GB // world_size
    model, opt = build(0, bug)
    ddp = DDP(model)
    v1, v2 = views()
    ps = perms(bug)
    for step in range(STEPS):
        rows = slice(step * GB + r * lb, step * GB + (r + 1) * lb)
        perm = ps[step] if bug == "shuffle_per_rank" else broadcast(ps[step].clone())
        logits, labels = ddp(v1[rows], v2[rows], perm)
        loss = F.cross_entropy(logits, labels)
        opt.zero_grad()
        loss.backward()
        opt.step()


def reference(world_size: int) -> None:
    """One device: the global batch, BatchNorm over the rank-sized blocks, the same permutations."""
    model, opt = build(world_size)
    v1, v2 = views()
    ps = perms()
    for step in range(STEPS):
        rows = slice(step * GB, (step + 1) * GB)
        logits, labels = model(v1[rows], v2[rows], ps[step])
        loss = F.cross_entropy(logits, labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
