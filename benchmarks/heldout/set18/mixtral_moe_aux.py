"""A Mixtral-style sparse MoE token classifier under DDP with a global-batch load-balancing loss: an
input projection, one ``MixtralSparseMoeBlock``-like layer (router ``Linear(D, E, bias=False)``, router
jitter noise ``hidden *= U(1 - J, 1 + J)`` in training, ``softmax`` over the router logits, top-2,
the top-2 weights renormalised to sum to 1, SwiGLU experts ``w2(silu(w1 x) * w3 x)``, residual), a token
head; the token cross entropy over the non-padding tokens, normalised by the all-reduced global count.
The auxiliary loss is transformers' ``load_balancing_loss_func`` with the attention mask (per top-k slot,
the fraction of valid tokens routed to each expert times the mean router probability, summed, times E),
made global as Megatron's ``moe_router_load_balancing_type="aux_loss"`` with ``tokens_per_expert``
all-reduced: the token fractions are all-reduced counts over the global valid-token count; the router
probabilities are this rank's sums over the global count, times W (DDP averages the gradients), so that
the gradient is that of the one-device loss. Total loss ``ce + COEF * aux``. SGD momentum with
``OneCycleLR`` (momentum cycled) stepped after every ``optimizer.step()``. Every random draw (features,
lengths, labels, jitter) is made for the global batch by a generator seeded per step; each rank keeps
its rows.

Follows huggingface/transformers ``models/mixtral/modeling_mixtral.py`` (``MixtralSparseMoeBlock``:
``router_jitter_noise``, ``routing_weights /= routing_weights.sum(dim=-1, keepdim=True)``;
``load_balancing_loss_func`` with ``attention_mask``; ``router_aux_loss_coef``), NVIDIA/Megatron-LM
``megatron/core/transformer/moe/router.py`` / ``moe_utils.py`` (``switch_load_balancing_loss_func``,
``tokens_per_expert`` all-reduced over the group), and the ``OneCycleLR`` docs (``scheduler.step()``
after ``optimizer.step()``, every batch).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from .common import all_reduce_sum, gen, rank

DI, D, FF, E, K, C, GB, S, SEED = 8, 16, 24, 4, 2, 5, 8, 6, 1803
LR, COEF, JITTER = 0.4, 0.5, 0.2
STEPS = 7
CORRECT = {"default": (2, 4)}
BUGS = {
    "tokens_per_expert_local": "the load-balancing loss's token fractions per expert are computed from the rank's own tokens (not all-reduced): the per-rank auxiliary loss of the stock load_balancing_loss_func",
    "aux_ignores_padding": "the attention mask is not passed to the load-balancing loss: padding tokens are counted in the token fractions and router probabilities",
    "topk_weights_not_renormalized": "the top-2 routing weights are not renormalised to sum to 1 (the raw softmax probabilities scale the expert outputs)",
    "aux_probs_from_topk_weights": "the auxiliary loss's router probability per expert is the mean of the renormalised top-k weights (zero for unselected experts) instead of the full softmax",
    "aux_not_times_world": "the rank's share of the global auxiliary loss is not multiplied by W: after DDP's averaging the load-balancing gradient is W times too small",
    "onecycle_before_optimizer_step": "OneCycleLR.step() is called before optimizer.step(): every update uses the next step's learning rate and momentum",
    "jitter_seeded_per_rank": "each rank draws the router jitter noise from its own rank-seeded generator instead of its rows of the global per-step draw",
}


class Expert(nn.Module):
    def __init__(self):
        super().__init__()
        self.w1, self.w2, self.w3 = nn.Linear(D, FF, bias=False), nn.Linear(FF, D, bias=False), nn.Linear(D, FF, bias=False)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class MoENet(nn.Module):
    def __init__(self, bug=None):
        super().__init__()
        self.bug = bug
        self.inp, self.gate, self.head = nn.Linear(DI, D), nn.Linear(D, E, bias=False), nn.Linear(D, C)
        self.experts = nn.ModuleList(Expert() for _ in range(E))

    def forward(self, x, jitter):
        h = self.inp(x).reshape(-1, D)
        hj = h * jitter.reshape(-1, 1)
        logits = self.gate(hj)
        probs = F.softmax(logits, dim=-1)
        wts, sel = probs.topk(K, dim=-1)
        if self.bug != "topk_weights_not_renormalized":
            wts = wts / wts.sum(-1, keepdim=True)
        out = torch.zeros_like(h)
        for e in range(E):
            tok, slot = torch.where(sel == e)
            if tok.numel():
                out = out.index_add(0, tok, self.experts[e](hj[tok]) * wts[tok, slot, None])
        y = self.head(h + out)
        return y.reshape(x.shape[0], x.shape[1], C), probs, sel, wts


def make_model(bug=None):
    torch.manual_seed(SEED)
    return MoENet(bug)


def batch(step: int):
    g = gen(SEED + step)
    x = torch.randn(GB, S, DI, generator=g)
    lens = torch.randint(2, S + 1, (GB,), generator=g)
    mask = torch.arange(S)[None] < lens[:, None]
    proj = torch.randn(DI, C, generator=gen(SEED + 999))
    y = (x @ proj).argmax(-1)
    jitter = torch.empty(GB, S).uniform_(1 - JITTER, 1 + JITTER, generator=g)
    return x, mask, y, jitter


def losses(out, probs, sel, wts, mask, y, reduce, bug=None):
    """The token CE sum and the aux loss numerator pieces; ``reduce`` sums over ranks (identity on one device).
    Returns (ce_sum, n_global, aux) with aux already in the per-rank form whose DDP average is the global loss."""
    m = mask.reshape(-1).float()
    ce_sum = (F.cross_entropy(out.reshape(-1, C), y.reshape(-1), reduction="none") * m).sum()
    n = reduce(m.sum())
    am = torch.ones_like(m) if bug == "aux_ignores_padding" else m
    n_aux = reduce(am.sum())
    counts = (F.one_hot(sel, E).float() * am[:, None, None]).sum(0)          # [K, E]
    if bug == "tokens_per_expert_local":
        f = counts / am.sum()
    else:
        f = reduce(counts) / n_aux
    p_src = torch.zeros_like(probs).scatter(1, sel, wts) if bug == "aux_probs_from_topk_weights" else probs
    p = (p_src * am[:, None]).sum(0) / n_aux                                # this rank's share
    aux = (f * p[None]).sum() * E
    return ce_sum, n, aux


def make_opt(model):
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=LR, total_steps=STEPS, pct_start=0.3)
    return opt, sched


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    r, w = rank(), world_size
    net = make_model(bug)
    model = DDP(net)
    opt, sched = make_opt(net)
    lb = GB // w
    for step in range(STEPS):
        x, mask, y, jitter = (t[r * lb:(r + 1) * lb] for t in batch(step))
        if bug == "jitter_seeded_per_rank":
            jitter = torch.empty(lb, S).uniform_(1 - JITTER, 1 + JITTER, generator=gen(SEED * 3 + 50 * step + r))
        out, probs, sel, wts = model(x, jitter)
        ce_sum, n, aux = losses(out, probs, sel, wts, mask, y, all_reduce_sum, bug)
        loss = ce_sum * w / n + COEF * aux * (1 if bug == "aux_not_times_world" else w)
        opt.zero_grad()
        loss.backward()
        if bug == "onecycle_before_optimizer_step":
            sched.step()
        opt.step()
        if bug != "onecycle_before_optimizer_step":
            sched.step()


def reference(world_size: int) -> None:
    model = make_model()
    opt, sched = make_opt(model)
    for step in range(STEPS):
        x, mask, y, jitter = batch(step)
        out, probs, sel, wts = model(x, jitter)
        ce_sum, n, aux = losses(out, probs, sel, wts, mask, y, lambda t: t)
        loss = ce_sum / n + COEF * aux
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
