"""A two-tower retrieval model with in-batch negatives across the ranks under DDP: a query tower (a sparse
``EmbeddingBag`` over three query feature ids, mean-pooled, concatenated with dense features, then an MLP)
and an item tower (a sparse ``EmbeddingBag`` over the item id and its category, summed, then an MLP), both
L2-normalised. Every rank gathers the item embeddings of the global batch with gradients
(``torch.distributed.nn.functional.all_gather``), scores its queries against all of them with a temperature,
subtracts the logQ correction ``log p(item)`` (item frequencies counted over the global batches seen so far,
the counts all-reduced) and takes the cross-entropy against its positives (rows ``rank * local_batch + i``
of the gathered items). The embedding tables are trained by ``SparseAdam``, the dense towers by ``Adam``;
each rank keeps its block of every global batch.

The one-device reference: the same loop on the global batch (the gather is the batch itself).

Follows pytorch/torchrec ``examples/retrieval/two_tower_train.py`` and ``examples/retrieval/modules/
two_tower.py`` (``TwoTower``, ``TwoTowerTrainTask``: query and candidate towers over sparse ``EmbeddingBag``
features; there the loss is a pointwise ``nn.BCEWithLogitsLoss`` on dot products, here an in-batch softmax), facebookresearch/dlrm ``dlrm_s_pytorch.py`` (``nn.EmbeddingBag(
n, m, mode="sum", sparse=True)`` with a sparse optimizer beside the dense one) and the sampling-bias
correction of in-batch softmax (Yi et al., 2019: ``s(x, y) - log p_j``), with the cross-rank gather of
in-batch negatives as in contrastive retrieval code (``torch.distributed.nn.functional.all_gather``).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from .common import all_gather, all_gather_grad, all_reduce, gen, rank, world

NQ, NI, NCAT, E, DENSE, GB, SEED, TEMP = 20, 24, 6, 8, 4, 8, 144, 0.2
ITERS = 6
STEPS = 2 * ITERS   # SparseAdam and Adam each step once per iteration
CORRECT = {"default": (2, 4)}
BUGS = {
    "gather_no_grad": "the item embeddings are gathered with a plain all_gather (no gradient) and only the rank's own slice keeps its graph",
    "logq_local_counts": "the logQ item frequencies are counted over the rank's local rows only (counts not all-reduced)",
    "temperature_twice": "the scores are divided by the temperature twice",
    "labels_no_rank_offset": "the positives' labels are arange(local_batch) without the rank * local_batch offset into the gathered items",
    "lr_swapped": "the sparse (SparseAdam) and dense (Adam) learning rates are swapped",
    "logq_sign": "the logQ correction is added (+ log p) instead of subtracted",
}
SPARSE_LR, DENSE_LR = 0.05, 0.01


class TwoTower(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(SEED)
        self.query_table = nn.EmbeddingBag(NQ, E, mode="mean", sparse=True)
        self.item_table = nn.EmbeddingBag(NI + NCAT, E, mode="sum", sparse=True)
        self.query_mlp = nn.Sequential(nn.Linear(E + DENSE, 16), nn.ReLU(), nn.Linear(16, E))
        self.item_mlp = nn.Sequential(nn.Linear(E, 16), nn.ReLU(), nn.Linear(16, E))

    def forward(self, q_ids, dense, item):
        q = self.query_mlp(torch.cat([self.query_table(q_ids), dense], -1))
        bag = torch.stack([item, NI + item % NCAT], -1)
        i = self.item_mlp(self.item_table(bag))
        return F.normalize(q, dim=-1), F.normalize(i, dim=-1)


def batch(step: int):
    g = gen(SEED + step)
    item = (NI * torch.rand(GB, generator=g) ** 2).long()   # popular items first: in-batch sampling is skewed
    q_ids = (item[:, None] + torch.randint(0, 4, (GB, 3), generator=g)) % NQ
    dense = torch.randn(GB, DENSE, generator=g)
    return q_ids, dense, item


def gathered_items(i_emb, bug=None):
    if bug != "gather_no_grad":
        return all_gather_grad(i_emb)
    if world() == 1:
        return i_emb
    parts = list(all_gather(i_emb).chunk(world()))
    parts[rank()] = i_emb
    return torch.cat(parts)


def run(model, fwd, rows, bug=None) -> None:
    sparse = [model.query_table.weight, model.item_table.weight]
    dense = [p for p in model.parameters() if all(p is not s for s in sparse)]
    s_lr, d_lr = (DENSE_LR, SPARSE_LR) if bug == "lr_swapped" else (SPARSE_LR, DENSE_LR)
    opts = [torch.optim.SparseAdam(sparse, lr=s_lr), torch.optim.Adam(dense, lr=d_lr)]
    counts = torch.zeros(NI)
    for step in range(ITERS):
        q_ids, dense_x, item = (rows(t) for t in batch(step))
        local_counts = torch.bincount(item, minlength=NI).float()
        counts += local_counts if bug == "logq_local_counts" else all_reduce(local_counts)
        log_p = torch.log((counts + 1) / (counts.sum() + NI))
        q, i = fwd(q_ids, dense_x, item)
        items = gathered_items(i, bug)
        all_ids = all_gather(item) if world() > 1 else item
        scores = q @ items.T / TEMP
        if bug == "temperature_twice":
            scores = scores / TEMP
        scores = scores + log_p[all_ids] if bug == "logq_sign" else scores - log_p[all_ids]
        offset = 0 if bug == "labels_no_rank_offset" else rank() * q.shape[0]
        loss = F.cross_entropy(scores, torch.arange(q.shape[0]) + offset)
        for opt in opts:
            opt.zero_grad()
        loss.backward()
        for opt in opts:
            opt.step()


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: the towers under DDP (sparse gradients averaged too), its block of rows."""
    r, lb = rank(), GB // world_size
    model = TwoTower()
    run(model, DDP(model), lambda t: t[r * lb:(r + 1) * lb], bug)


def reference(world_size: int) -> None:
    """One device: the same loop on the global batch."""
    model = TwoTower()
    run(model, model, lambda t: t)
