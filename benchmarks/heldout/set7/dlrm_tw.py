"""DLRM with table-wise model-parallel embeddings by hand. Four ``EmbeddingBag`` tables (sum pooling);
rank r owns whole tables ``[r NT/W, (r+1) NT/W)`` (kept in a ``ModuleDict`` under their global names) and
looks them up for the GLOBAL batch; the pooled embeddings ``[B, n_local, D]`` go through an autograd
``all_to_all`` (batch blocks out, the other ranks' tables for this rank's batch block in), are put
back in table order, and meet this rank's bottom-MLP output in DLRM's dot interaction (pairwise dots,
strict lower triangle) and the top MLP. The dense MLPs are data parallel (gradients all-reduced and
divided by W, as DDP would); an owned table's gradient arrives summed over the ranks' local losses by
the all_to_all's backward and is divided by W so that it is the gradient of the global mean loss. All
tables are built on every rank from the same seed, in order, and the rank keeps its own.

Follows facebookresearch/dlrm ``dlrm_s_pytorch.py`` (``DLRM_Net.distributed_forward``: bottom MLP on
the local batch, ``apply_emb`` on the local tables, ``ext_dist.alltoall(ly, self.n_emb_per_rank)``,
``interact_features`` with ``li, lj`` of the lower triangle, top MLP; ``n_emb_per_rank`` and
``local_emb_slice`` from ``get_split_lengths`` / ``get_my_slice``) and ``extend_distributed.py``
(``alltoall``, ``All2All_Req``); pytorch/torchrec ``distributed/dist_data.py`` (``_recat``: the
received pooled embeddings reordered by table). The one-device reference holds all tables and the
mean BCE loss over the global batch.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .common import all_reduce, all_to_all, gen, rank

NT, ROWS, DIM, DENSE, POOL, BG = 4, 12, 8, 4, 2, 8
LR, SEED = 0.3, 23
STEPS = 4
CORRECT = {"default": (2, 4)}
BUGS = {
    "emb_grads_not_scaled": "owned tables' gradients (summed over ranks by the all_to_all backward) not divided by W",
    "top_not_reduced": "only the bottom MLP's gradients are all-reduced; the top MLP's stay local",
    "dense_grad_sum": "dense gradients all-reduced but not divided by W",
    "a2a_no_permute": "received [W, B_local, n_local, D] reshaped to [B_local, W*n_local, D] without the permute",
    "tables_round_robin": "rank r owns tables r, r+W, ... while the a2a reorder assumes contiguous tables",
    "init_local_only": "each rank builds only its own tables right after the seed (rank 1's tables get tables 0-1's init)",
    "allreduce_all_params": "every parameter's gradient all-reduced and divided by W, the tables' too (other ranks' tables mixed in)",
}


class DLRM(nn.Module):
    def __init__(self, tables: dict[int, nn.EmbeddingBag], bot: nn.Module, top: nn.Module, w: int, bug=None):
        super().__init__()
        self.bot, self.top = bot, top
        self.emb = nn.ModuleDict({f"t{t}": e for t, e in tables.items()})
        self.owned, self.w, self.bug = list(tables), w, bug

    def forward(self, dense: torch.Tensor, sparse: torch.Tensor) -> torch.Tensor:
        """``dense``: this rank's rows; ``sparse``: ``[NT, B_global, POOL]`` indices (owned tables used)."""
        x = self.bot(dense)
        ly = torch.stack([self.emb[f"t{t}"](sparse[t]) for t in self.owned], 1)
        if self.w > 1:
            got = all_to_all(ly)  # chunk j: rank j's tables for this rank's batch block
            bl, nl = x.shape[0], ly.shape[1]
            if self.bug == "a2a_no_permute":
                ly = got.reshape(bl, self.w * nl, DIM)
            else:
                ly = got.view(self.w, bl, nl, DIM).permute(1, 0, 2, 3).reshape(bl, self.w * nl, DIM)
        feats = torch.cat([x.unsqueeze(1), ly], 1)
        z = feats @ feats.transpose(1, 2)
        li, lj = torch.tril_indices(NT + 1, NT + 1, offset=-1)
        return self.top(torch.cat([x, z[:, li, lj]], 1)).squeeze(1)


def build(w: int, r: int, bug=None) -> DLRM:
    torch.manual_seed(SEED)
    bot = nn.Sequential(nn.Linear(DENSE, 8), nn.ReLU(), nn.Linear(8, DIM), nn.ReLU())
    n = NT // w
    owned = list(range(r, NT, w)) if bug == "tables_round_robin" else list(range(r * n, (r + 1) * n))
    if bug == "init_local_only":
        tables = {t: nn.EmbeddingBag(ROWS, DIM, mode="sum") for t in owned}
    else:
        every = {t: nn.EmbeddingBag(ROWS, DIM, mode="sum") for t in range(NT)}
        tables = {t: every[t] for t in owned}
    ninter = (NT + 1) * NT // 2
    top = nn.Sequential(nn.Linear(DIM + ninter, 8), nn.ReLU(), nn.Linear(8, 1))
    return DLRM(tables, bot, top, w, bug)


def batch(step: int):
    g = gen(300 + step)
    dense = torch.randn(BG, DENSE, generator=g)
    sparse = torch.randint(0, ROWS, (NT, BG, POOL), generator=g)
    return dense, sparse, (torch.rand(BG, generator=g) < 0.5).float()


def sync_grads(model: DLRM, w: int, bug) -> None:
    if bug == "allreduce_all_params":
        for p in model.parameters():
            p.grad.copy_(all_reduce(p.grad) / w)
        return
    dense = list(model.bot.parameters()) + ([] if bug == "top_not_reduced" else list(model.top.parameters()))
    for p in dense:
        p.grad.copy_(all_reduce(p.grad) / (1 if bug == "dense_grad_sum" else w))
    if bug != "emb_grads_not_scaled":
        for p in model.emb.parameters():
            p.grad.div_(w)


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: its batch block through the dense MLPs, its tables for the global batch."""
    r, w = rank(), world_size
    model = build(w, r, bug)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    bl = BG // w
    for step in range(STEPS):
        dense, sparse, y = batch(step)
        opt.zero_grad()
        logit = model(dense[r * bl:(r + 1) * bl], sparse)
        F.binary_cross_entropy_with_logits(logit, y[r * bl:(r + 1) * bl]).backward()
        sync_grads(model, w, bug)
        opt.step()


def reference(world_size: int) -> None:
    """One device: every table, the global batch, the mean loss."""
    model = build(1, 0)
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    for step in range(STEPS):
        dense, sparse, y = batch(step)
        opt.zero_grad()
        F.binary_cross_entropy_with_logits(model(dense, sparse), y).backward()
        opt.step()
