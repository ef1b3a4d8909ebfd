"""A Switch-Transformer MoE layer without expert parallelism under DDP (every rank holds every expert):
a top-1 router (softmax over the experts of the router logits, the input multiplied by uniform jitter
noise ``U(1 - eps, 1 + eps)`` in training, drawn for the global batch from a generator seeded per step),
a capacity of ``ceil(CF * global tokens / experts)`` per expert with the tokens' priority in the global
order (each rank offsets its positions by the earlier ranks' counts, all-gathered), the dropped tokens
passed through by the residual only, the expert output scaled by the router probability; the
load-balancing loss ``E * sum_e f_e * P_e`` with the fractions ``f_e`` counted over the global batch
(all-reduced, no gradient) and ``P_e`` the rank's mean router probability (DDP's average makes it the
global mean), and the router z-loss ``mean(logsumexp(logits) ** 2)`` times its coefficient once. Task:
regression of a per-token target, MSE mean over the rank's tokens.

The one-device reference: the same layer on the global batch.

Follows huggingface/transformers ``src/transformers/models/switch_transformers/modeling_switch_transformers.py``
(``SwitchTransformersTop1Router._compute_router_probabilities``: jitter ``hidden_states *=
torch.empty_like(hidden_states).uniform_(1.0 - self.jitter_noise, 1.0 + self.jitter_noise)``; ``forward``:
``token_priority = torch.cumsum(expert_index, dim=-2)``, ``expert_capacity_mask = token_priority <=
self.expert_capacity``; ``router_z_loss_func``: ``torch.logsumexp(router_logits, dim=-1) ** 2`` averaged;
``load_balancing_loss_func``: ``torch.mean(tokens_per_group_and_expert * router_prob_per_group_and_expert)
* num_experts**2``; ``SwitchTransformersSparseMLP``: ``hidden_states = router_probs * next_states``) and
google-research/t5x / mesh-tensorflow ``mesh_tensorflow/transformer/moe.py`` (``_switch_gating``:
capacity ``expert_capacity = capacity_factor * group_size / num_experts``, z-loss and load-balancing
loss coefficients).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from .common import all_gather, all_reduce, gen, rank, world

D, E, T, B, SEED = 8, 4, 6, 4, 113
CF, JITTER, AUX_COEF, Z_COEF = 1.0, 0.2, 0.1, 0.05
STEPS = 5
CORRECT = {"default": (2, 4)}
BUGS = {
    "capacity_local": "the capacity is ceil(CF * the rank's tokens / E) with priorities counted within the rank (no offset by the earlier ranks)",
    "aux_local_fraction": "the load-balancing fractions f_e are counted over the rank's tokens only (the all-reduce of the counts missing)",
    "aux_counts_over_local": "the all-reduced expert counts are divided by the rank's token count instead of the global one (f doubled)",
    "z_loss_scaled_twice": "the router z-loss is multiplied by its coefficient twice (inside the loss function and again in the sum)",
    "jitter_per_rank": "the router jitter noise is drawn from a generator seeded per rank instead of rows of the global draw",
    "no_gate_scale": "the expert output is not multiplied by the router probability: the router gets no gradient from the task loss",
}


class SwitchMLP(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(SEED)
        self.inp = nn.Linear(D, D)
        self.router = nn.Linear(D, E, bias=False)
        self.experts = nn.ModuleList(nn.Sequential(nn.Linear(D, 2 * D), nn.ReLU(), nn.Linear(2 * D, D))
                                     for _ in range(E))
        self.out = nn.Linear(D, 1)

    def forward(self, x, jitter, offset, capacity, bug=None):
        h = self.inp(x).reshape(-1, D)
        logits = self.router(h * jitter)
        probs = logits.softmax(-1)
        top_p, idx = probs.max(-1)
        onehot = F.one_hot(idx, E).to(h.dtype)
        priority = torch.cumsum(onehot, 0) + offset
        keep = ((priority * onehot).sum(-1) <= capacity)
        y = torch.zeros_like(h)
        for e, expert in enumerate(self.experts):   # dispatch by mask (mesh-tf's dense dispatch/combine)
            y = y + expert(h) * ((idx == e) & keep).to(h.dtype)[:, None]
        gate = 1.0 if bug == "no_gate_scale" else (top_p * keep)[:, None]
        h = h + y * gate
        return self.out(h).reshape(x.shape[:2]), logits, probs, onehot


def z_loss(logits, bug=None):
    z = torch.logsumexp(logits, -1).pow(2).mean()
    return z * Z_COEF if bug == "z_loss_scaled_twice" else z


def data(step: int):
    g = gen(SEED + step)
    x = torch.randn(B, T, D, generator=g)
    y = x[..., 0] * x[..., 1] + x[..., 2].abs()
    jit = torch.empty(B * T, D).uniform_(1 - JITTER, 1 + JITTER, generator=g)
    return x, y, jit


def run(model, fwd, rows, dist_ops, bug=None, jit_shift=0) -> None:
    """``dist_ops``: (offset of the earlier ranks' counts, global counts) from the rank's one-hot."""
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    for step in range(STEPS):
        x, y, jit = data(step)
        x, y = rows(x), rows(y)
        jit = rows(jit.reshape(B, T, D)).reshape(-1, D)
        if jit_shift:
            jit = torch.empty_like(jit).uniform_(1 - JITTER, 1 + JITTER, generator=gen(SEED + step + jit_shift))
        n_local = x.shape[0] * T
        with torch.no_grad():   # the routing decision, for the global priorities
            _, _, _, onehot0 = model(x, jit, 0, float("inf"))
        offset, counts = dist_ops(onehot0.sum(0))
        capacity = math.ceil(CF * B * T / E)
        if bug == "capacity_local":
            offset, capacity = 0, math.ceil(CF * n_local / E)
        pred, logits, probs, onehot = fwd(x, jit, offset, capacity, bug)
        n_all = n_local if bug == "aux_counts_over_local" else B * T
        f = onehot.sum(0) / n_local if bug == "aux_local_fraction" else counts / n_all
        aux = E * (f * probs.mean(0)).sum()
        loss = F.mse_loss(pred, y) + AUX_COEF * aux + Z_COEF * z_loss(logits, bug)
        opt.zero_grad()
        loss.backward()
        opt.step()


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: the layer under DDP, its block of sequences, counts exchanged for capacity and aux."""
    r, lb = rank(), B // world_size
    model = SwitchMLP()

    def dist_ops(local_counts):
        every = all_gather(local_counts[None])
        return every[:r].sum(0), all_reduce(local_counts)
    run(model, DDP(model), lambda t: t[r * lb:(r + 1) * lb], dist_ops, bug,
        1000 * (r + 1) if bug == "jitter_per_rank" else 0)


def reference(world_size: int) -> None:
    """One device: the same layer on the global batch."""
    model = SwitchMLP()
    run(model, model, lambda t: t, lambda c: (torch.zeros_like(c), c.clone()))
