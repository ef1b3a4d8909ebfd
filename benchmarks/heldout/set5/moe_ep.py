"""Expert-parallel top-1 mixture of experts written by hand: data parallel over tokens (each rank its
block of the global tokens), the router gate replicated (its gradients, with the other replicated
layers', all-reduced and averaged by hand), the E experts split across ranks (rank r owns experts
``r*E/W ..``, kept under their global index so names match the one-device model), tokens dispatched
by all-gather and combined by reduce-scatter, a Switch-style capacity (``ceil(capacity_factor *
tokens / E)`` over the tokens routed together, overflow dropped to the residual), multiplicative router
jitter drawn for the global batch, and the Switch load-balancing loss ``E * sum_e f_e * P_e`` with the
dispatch fractions ``f`` all-reduced. Expert gradients are divided by the world size: each rank's loss
is its tokens' mean, so summed over ranks they are W times the global mean's.

Follows Megatron-LM ``megatron/core/transformer/moe/token_dispatcher.py`` (``MoEAllGatherToken
Dispatcher``: all-gather the hidden states and routing, each rank's local experts, reduce-scatter the
output), ``moe/router.py`` / ``moe_utils.py`` (``switch_load_balancing_loss_func``, capacity and token
drop), fairseq ``fairseq/modules/moe/top2gate.py``/``top1gate`` (Switch jitter ``multiplicative_
jitter``, ``capacity = ceil(num_tokens / num_experts * capacity_factor)``) and DeepSpeed
``deepspeed/moe/sharded_moe.py`` (expert parameters excluded from the data-parallel all-reduce).
"""
from __future__ import annotations

import math

import torch
import torch.distributed as tdist
import torch.nn.functional as F
from torch import nn

from .common import all_reduce_grads, gen, rank, world

DIN, D, HID, E, OUT, TOKENS = 6, 8, 12, 4, 3, 16
CAPACITY_FACTOR, JITTER, AUX = 1.25, 0.2, 0.1
LR, MOMENTUM = 0.1, 0.9
STEPS = 5
CORRECT = {"default": (2, 4)}
BUGS = {
    "gate_not_allreduced": "the router gate left out of the hand-written all-reduce of the replicated layers' gradients",
    "capacity_per_rank": "expert capacity computed from the rank's own token count, not the tokens routed together",
    "router_noise_local": "router jitter drawn per rank with torch.rand_like on the local logits (global RNG), not for the global batch",
    "aux_local_fraction": "the load-balancing loss uses the rank's own dispatch fractions f, not the all-reduced ones",
    "expert_grads_not_scaled": "expert gradients not divided by the world size (the ranks' summed losses are W x the mean)",
    "experts_allreduced": "every gradient averaged over ranks as DDP would, the experts' too (each rank's experts differ)",
}


class Expert(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(D, HID), nn.Linear(HID, D)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(h)))


class Net(nn.Module):
    """``own``: the expert indices this process keeps (all on one device)."""

    def __init__(self, own: range) -> None:
        super().__init__()
        self.inp = nn.Linear(DIN, D)
        self.gate = nn.Linear(D, E, bias=False)
        experts = [Expert() for _ in range(E)]          # built whole, same init everywhere
        self.experts = nn.ModuleDict({str(e): experts[e] for e in own})
        self.head = nn.Linear(D, OUT)

    def forward(self, x, y, step, bug=None, w=1):
        return moe_loss(self, x, y, step, bug, w)


def route(probs: torch.Tensor, idx: torch.Tensor, capacity: int) -> torch.Tensor:
    """Keep-mask: a token kept when fewer than ``capacity`` earlier tokens went to its expert."""
    onehot = F.one_hot(idx, E)
    pos = (onehot.cumsum(0) - 1).gather(1, idx[:, None]).squeeze(1)
    return pos < capacity


def jitter(step: int, n: int) -> torch.Tensor:
    return torch.empty(n, E).uniform_(1 - JITTER, 1 + JITTER, generator=gen(700 + step))


def gather(t: torch.Tensor) -> torch.Tensor:
    parts = [torch.empty_like(t) for _ in range(world())]
    tdist.all_gather(parts, t.contiguous())
    return torch.cat(parts)


class _AllGather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return gather(x)

    @staticmethod
    def backward(ctx, g):
        g = g.clone()
        tdist.all_reduce(g)
        return g.chunk(world())[rank()].contiguous()


class _ReduceScatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        x = x.clone()
        tdist.all_reduce(x)
        return x.chunk(world())[rank()].contiguous()

    @staticmethod
    def backward(ctx, g):
        return gather(g)


def moe_loss(model: "Net", x, y, step, bug, w) -> torch.Tensor:
    """The loss of ``x``'s tokens: task MSE plus the weighted load-balancing loss."""
    h = torch.tanh(model.inp(x))
    logits = model.gate(h)
    if bug == "router_noise_local":
        logits = logits * torch.empty_like(logits).uniform_(1 - JITTER, 1 + JITTER)
    else:
        logits = logits * jitter(step, TOKENS).chunk(w)[rank() if w > 1 else 0]
    probs = logits.softmax(-1)
    idx = probs.argmax(-1)
    p_sel = probs.gather(1, idx[:, None]).squeeze(1)
    counts = F.one_hot(idx, E).sum(0).float()
    if w > 1:
        h_all, p_all, idx_all = _AllGather.apply(h), _AllGather.apply(p_sel), gather(idx)
        if bug != "aux_local_fraction":
            tdist.all_reduce(counts)
    else:
        h_all, p_all, idx_all = h, p_sel, idx
    n_routed = x.shape[0] if bug == "capacity_per_rank" else idx_all.shape[0]
    keep = route(probs, idx_all, math.ceil(CAPACITY_FACTOR * n_routed / E))
    out = torch.zeros_like(h_all)
    for name, expert in model.experts.items():
        sel = (idx_all == int(name)) & keep
        out = out.index_add(0, sel.nonzero().squeeze(1), p_all[sel, None] * expert(h_all[sel]))
    out = _ReduceScatter.apply(out) if w > 1 else out
    f = counts / counts.sum()
    aux = E * (f * probs.mean(0)).sum()
    return F.mse_loss(model.head(h + out), y) + AUX * aux


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = gen(800 + step)
    return torch.randn(TOKENS, DIN, generator=g), torch.randn(TOKENS, OUT, generator=g)


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: its token block, its experts, the replicated layers' gradients averaged by hand."""
    r, w = rank(), world_size
    per = E // w
    model = Net(range(r * per, (r + 1) * per))
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    shared = [model.inp, model.head] + ([] if bug == "gate_not_allreduced" else [model.gate])
    for step in range(STEPS):
        x, y = batch(step)
        opt.zero_grad()
        model(x.chunk(w)[r], y.chunk(w)[r], step, bug, w).backward()
        if bug == "experts_allreduced":
            all_reduce_grads(model.parameters(), divide=w)
        else:
            all_reduce_grads([p for m in shared for p in m.parameters()], divide=w)
            if bug != "expert_grads_not_scaled":
                for p in model.experts.parameters():
                    p.grad.div_(w)
        opt.step()


def reference(world_size: int) -> None:
    """One device: every expert, every token routed together."""
    model = Net(range(E))
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    for step in range(STEPS):
        x, y = batch(step)
        opt.zero_grad()
        model(x, y, step).backward()
        opt.step()
