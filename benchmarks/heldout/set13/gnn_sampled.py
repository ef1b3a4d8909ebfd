"""A two-layer GCN by hand (message passing with ``index_add_``) trained on node-classification
mini-batches under DDP: each step a global batch of seed nodes, each rank its block of seeds; per step
every node keeps ``K`` of its in-neighbours (sampled with one generator seeded per step, so every rank
samples what the one-device run samples); layer 1 is computed for the seeds and their sampled
neighbours, layer 2 for the seeds, each node aggregating its sampled neighbours and itself with GCN's
symmetric normalisation ``1 / sqrt((deg(src) + 1) (deg(dst) + 1))`` by the full graph's degrees. Loss:
cross entropy on the seed nodes only, mean over the rank's seeds (DDP's average is the global mean).
SGD with momentum and weight decay.

The one-device reference: the same model on the global batch of seeds (whose sampled neighbourhoods
are the union of the ranks').

Follows pyg-team/pytorch_geometric ``torch_geometric/nn/conv/gcn_conv.py`` (``gcn_norm``: self-loops
added, ``deg = scatter(edge_weight, col, dim=0, dim_size=num_nodes, reduce='sum')``, ``deg_inv_sqrt[col]
* edge_weight * deg_inv_sqrt[row]``; ``propagate`` as a scatter-add into the destination nodes) and
``examples/multi_gpu/distributed_sampling.py`` (``train_idx.split(train_idx.size(0) // world_size)[rank]``,
``NeighborLoader``, the model under ``DistributedDataParallel``, ``F.cross_entropy(out[:batch.batch_size],
batch.y[:batch.batch_size])``).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from .common import gen, rank

N, E_PER, FEAT, HID, C, K, GB, SEED = 40, 4, 6, 12, 3, 3, 8, 83
STEPS = 5
CORRECT = {"default": (2, 4)}
BUGS = {
    "subgraph_degree": "the GCN normalisation uses the degrees within the rank's sampled subgraph instead of the full graph's degrees",
    "seeds_overlap": "each rank's block of seeds runs one past its end: the boundary seeds are counted twice across ranks",
    "loss_all_nodes": "the loss is taken over every node of the sampled subgraph (seeds and neighbours), not the seed nodes only",
    "no_self_loops": "the aggregation forgets the self-loops: a node does not add its own features",
    "sampler_per_rank": "the neighbour sampler's generator is seeded with the rank: each rank samples different neighbourhoods",
    "loss_sum": "the seed loss is summed instead of averaged: DDP averages the ranks' sums",
}


def graph():
    """A fixed random graph: features, labels, edges (src, dst) without duplicates or self-loops."""
    g = gen(SEED)
    x = torch.randn(N, FEAT, generator=g)
    src = torch.randint(0, N, (N * E_PER,), generator=g)
    dst = torch.randint(0, N, (N * E_PER,), generator=g)
    keep = src != dst
    e = torch.unique(torch.stack([src[keep], dst[keep]]), dim=1)
    y = (x[:, :C] + 0.2 * torch.randn(N, C, generator=g)).argmax(1)
    return x, y, e


X, Y, EDGES = graph()
DEG = torch.zeros(N).index_add_(0, EDGES[1], torch.ones(EDGES.shape[1]))


def sample(step: int, seed_shift: int = 0) -> torch.Tensor:
    """For every node, K of its in-edges: the K smallest of one random score per edge."""
    score = torch.rand(EDGES.shape[1], generator=gen(SEED * 10 + step + seed_shift))
    keep = torch.zeros(EDGES.shape[1], dtype=torch.bool)
    for v in range(N):
        idx = (EDGES[1] == v).nonzero().flatten()
        keep[idx[score[idx].argsort()[:K]]] = True
    return EDGES[:, keep]


def block(edges: torch.Tensor, dst_nodes: torch.Tensor, self_loops: bool = True) -> torch.Tensor:
    """The sampled in-edges of ``dst_nodes``, plus their self-loops."""
    mask = torch.isin(edges[1], dst_nodes)
    e = edges[:, mask]
    if self_loops:
        e = torch.cat([e, torch.stack([dst_nodes, dst_nodes])], 1)
    return e


class GCN(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(SEED)
        self.lin1 = nn.Linear(FEAT, HID)
        self.lin2 = nn.Linear(HID, C)

    @staticmethod
    def propagate(h, e, deg):
        norm = (deg[e[0]] + 1).rsqrt() * (deg[e[1]] + 1).rsqrt()
        return torch.zeros(N, h.shape[1]).index_add_(0, e[1], h[e[0]] * norm[:, None])

    def forward(self, x, e1, e2, deg):
        h = F.relu(self.propagate(x @ self.lin1.weight.t(), e1, deg) + self.lin1.bias)
        return self.propagate(h @ self.lin2.weight.t(), e2, deg) + self.lin2.bias


def seed_batch(step: int) -> torch.Tensor:
    return torch.randperm(N, generator=gen(SEED + 7 * step))[:GB]


def run(model, fwd, pick, bug=None, seed_shift=0) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9, weight_decay=5e-4)
    for step in range(STEPS):
        seeds = pick(seed_batch(step))
        edges = sample(step, seed_shift)
        loops = bug != "no_self_loops"
        e2 = block(edges, seeds, loops)
        hop1 = torch.unique(torch.cat([seeds, e2[0]]))
        e1 = block(edges, hop1, loops)
        deg = DEG
        if bug == "subgraph_degree":
            sub = e1[:, e1[0] != e1[1]]
            deg = torch.zeros(N).index_add_(0, sub[1], torch.ones(sub.shape[1]))
        out = fwd(X, e1, e2 if bug != "loss_all_nodes" else e1, deg)
        nodes = hop1 if bug == "loss_all_nodes" else seeds
        loss = F.cross_entropy(out[nodes], Y[nodes], reduction="sum" if bug == "loss_sum" else "mean")
        opt.zero_grad()
        loss.backward()
        opt.step()


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: the GCN under DDP, its block of each step's seeds."""
    r, lb = rank(), GB // world_size
    model = GCN()
    extra = 1 if bug == "seeds_overlap" else 0
    run(model, DDP(model), lambda s: s[r * lb:(r + 1) * lb + extra], bug,
        100 * (r + 1) if bug == "sampler_per_rank" else 0)


def reference(world_size: int) -> None:
    """One device: every seed of the step."""
    model = GCN()
    run(model, model, lambda s: s)
