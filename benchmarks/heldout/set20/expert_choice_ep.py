"""Expert-choice MoE routing (Zhou et al. 2022) with expert parallelism written by hand, data parallel over
the same ranks: an input projection, LayerNorm, a router (token-to-expert affinities ``S = softmax(x W_g)``
over the experts), E = 4 two-layer GELU experts stored stacked (``moe.w1`` [E, D, F], ``moe.w2`` [E, F, D],
each rank holding E / W of them: rows ``rank * E/W ...``, sharded along dim 0), a residual and a linear
head with cross-entropy. Each rank embeds and routes its own tokens; the normalised tokens and their
affinities are all-gathered with autograd, each of the rank's experts picks its top-``k`` tokens of the
global batch (``k = n_global * capacity_factor / E``) with gates ``G`` from ``S``, the gated expert
outputs are scattered into a global [n, D] buffer, summed over the ranks with an autograd all-reduce
(whose backward all-reduces the output gradient), and each rank keeps its rows. The loss is the rank's
mean divided by W (so that the sum over the ranks is the global mean); the experts' gradients are then
complete on their owner, and the replicated parameters' (input projection, norm, router, head) are
all-reduced by summation, as Megatron's ``finalize_model_grads`` does for the data-parallel group. SGD
with momentum. Every batch is drawn for the global batch by a generator seeded per step; each rank keeps
its rows.

The one-device reference: the same model with all E experts on the global batch.

Follows google-research's expert-choice description (Zhou et al., "Mixture-of-Experts with Expert Choice
Routing", 2022: ``S = Softmax(X W_g)``, ``G, I = TopK(S^T, k)``, ``k = n c / e``), the EC router of
google/flax-based ``flaxformer/architectures/moe/routing.py`` (``ExpertsChooseMaskedRouter``), NVIDIA
Megatron-LM ``core/transformer/moe/`` (expert-parallel token gather / scatter, ``finalize_model_grads``),
and ``torch.distributed.nn.functional`` (``all_gather`` / ``all_reduce`` with autograd).
"""
from __future__ import annotations

import torch
import torch.distributed as tdist
import torch.nn.functional as F
from torch import nn

from .common import all_gather_grad, all_reduce_grad, all_reduce_sum, gen, rank

DI, D, FF, E, C, GB, CF, SEED = 10, 16, 24, 4, 5, 16, 1.0, 2002
LR, MOM = 0.1, 0.9
STEPS = 6
CORRECT = {"default": (2, 4)}
BUGS = {
    "router_grads_not_allreduced": "the router's weight is left out of the replicated parameters whose gradients are all-reduced: each rank's router steps on its own tokens' gradient only",
    "replicated_grads_averaged": "the replicated parameters' gradients are all-reduced and divided by W (DDP's average) although the loss is already divided by W: those gradients are W times too small",
    "capacity_from_local_tokens": "the expert capacity k is computed from the rank's local token count instead of the global token count gathered to the experts: each expert picks W times too few tokens",
    "combine_without_autograd": "the expert outputs are summed over the ranks with an in-place dist.all_reduce outside autograd: the experts' and the gathered tokens' gradients only see the rank's own tokens' loss",
    "expert_init_per_rank_seed": "each rank initialises its local experts from its own seed (seed + rank) instead of taking its slice of the full expert initialisation",
    "softmax_over_tokens": "the router's softmax is taken over the tokens (dim 0) instead of over the experts: the affinities and gates are normalised along the wrong axis",
    "gates_not_applied": "the expert outputs are combined without multiplying by the gate values: the router receives no gradient from the task loss",
}


class ECModel(nn.Module):
    def __init__(self, first: int = 0, n_local: int = E):
        super().__init__()
        self.inp, self.norm = nn.Linear(DI, D), nn.LayerNorm(D)
        self.router = nn.Linear(D, E, bias=False)
        self.moe = nn.Module()
        self.moe.w1 = nn.Parameter(torch.randn(E, D, FF) / D ** 0.5)
        self.moe.w2 = nn.Parameter(torch.randn(E, FF, D) / FF ** 0.5)
        self.head = nn.Linear(D, C)
        self.first, self.n_local = first, n_local

    def shard(self, r: int, w: int, bug=None):
        el = E // w
        self.first, self.n_local = r * el, el
        if bug == "expert_init_per_rank_seed":
            g = gen(SEED + 31 * (r + 1))
            w1, w2 = torch.randn(el, D, FF, generator=g) / D ** 0.5, torch.randn(el, FF, D, generator=g) / FF ** 0.5
        else:
            w1, w2 = self.moe.w1.detach()[r * el:(r + 1) * el], self.moe.w2.detach()[r * el:(r + 1) * el]
        self.moe.w1, self.moe.w2 = nn.Parameter(w1.clone()), nn.Parameter(w2.clone())
        return self

    def forward(self, x, gather=lambda t: t, combine=lambda t: t, rows=slice(None), bug=None, n_cap=None):
        h = self.inp(x)
        z = self.norm(h)
        probs = F.softmax(self.router(z), dim=0 if bug == "softmax_over_tokens" else -1)
        z_all, p_all = gather(z), gather(probs)
        n = z_all.shape[0]
        k = int((n_cap or n) * CF / E)
        out = torch.zeros_like(z_all)
        for j in range(self.n_local):
            e = self.first + j
            gates, idx = torch.topk(p_all[:, e], k)
            y = F.gelu(z_all[idx] @ self.moe.w1[j]) @ self.moe.w2[j]
            if bug != "gates_not_applied":
                y = y * gates[:, None]
            out = out.index_add(0, idx, y)
        out = combine(out)[rows]
        return self.head(h + out)


def batch(step: int):
    g = gen(SEED + 100 * step)
    x = torch.randn(GB, DI, generator=g)
    y = (x[:, :C] + 0.3 * torch.randn(GB, C, generator=g)).argmax(1)
    return x, y


def make_model():
    torch.manual_seed(SEED)
    return ECModel()


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: its tokens, its E / W experts, tokens gathered to the experts and combined back."""
    r, w = rank(), world_size
    model = make_model().shard(r, w, bug)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOM)
    replicated = [p for n, p in model.named_parameters() if not n.startswith("moe.")]
    if bug == "router_grads_not_allreduced":
        replicated = [p for n, p in model.named_parameters() if not n.startswith(("moe.", "router."))]
    nl = GB // w
    rows = slice(r * nl, (r + 1) * nl)

    def combine(t):
        if bug == "combine_without_autograd":
            return t + (all_reduce_sum(t) - t.detach())
        return all_reduce_grad(t)

    for step in range(STEPS):
        x, y = batch(step)
        logits = model(x[rows], all_gather_grad, combine, rows, bug,
                       n_cap=nl if bug == "capacity_from_local_tokens" else None)
        loss = F.cross_entropy(logits, y[rows]) / w
        opt.zero_grad()
        loss.backward()
        for p in replicated:
            if p.grad is None:
                continue
            tdist.all_reduce(p.grad)
            if bug == "replicated_grads_averaged":
                p.grad /= w
        opt.step()


def reference(world_size: int) -> None:
    """One device: all experts, the global batch."""
    model = make_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOM)
    for step in range(STEPS):
        x, y = batch(step)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
