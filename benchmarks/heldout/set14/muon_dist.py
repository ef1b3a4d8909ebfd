"""Distributed Muon with an auxiliary AdamW under DDP: the hidden 2-D weights of a residual MLP over token
embeddings are updated by Muon (momentum ``lerp``, Nesterov, Newton-Schulz orthogonalisation, the
``max(1, rows/cols) ** 0.5`` shape scale), the embedding, the biases and the head by AdamW in the same
optimizer (``MuonWithAuxAdam``'s ``use_muon`` groups). The Muon matrices are grouped by shape (one group per
shape; modded-nanogpt groups its matrices by size) and assigned round-robin within a group: in each block of ``world`` matrices rank r updates the r-th from its DDP-averaged gradient, then
``all_gather`` hands every rank the block's updated weights (the list padded to a multiple of the world).
Each rank keeps its block of every global batch.

The one-device reference: the same optimizer with world 1 (every matrix updated locally) on the global batch.

Follows KellerJordan/Muon ``muon.py`` (``zeropower_via_newtonschulz5``, ``muon_update``,
``MuonWithAuxAdam.step``: ``params_pad``, ``params[base_i + dist.get_rank()]``, ``dist.all_gather(
params_pad[base_i:base_i + world_size], params_pad[base_i + rank])``) and karpathy/nanochat
``nanochat/optims.py`` (the Muon / AdamW split of the parameters). The orthogonalisation runs in float32
here (the original casts to bfloat16 on GPUs).
"""
from __future__ import annotations

import torch
import torch.distributed as tdist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from .common import gen, rank, world

V, D, H, T, GB, SEED = 16, 8, 16, 4, 8, 141
STEPS = 6
CORRECT = {"default": (2, 4)}
BUGS = {
    "share_not_gathered": "the all_gather after each block is left out: a rank keeps stale copies of the matrices other ranks updated",
    "shape_scale_inverted": "the shape scale is max(1, cols/rows) ** 0.5 instead of max(1, rows/cols) ** 0.5",
    "nesterov_dropped": "the update is the momentum buffer itself, not the Nesterov blend grad.lerp(momentum, beta)",
    "orthogonalised_before_momentum": "the gradient is orthogonalised before it enters the momentum buffer (momentum of orthogonalised gradients) instead of the Nesterov momentum being orthogonalised",
    "adam_group_muon_lr": "the AdamW group (embedding, biases, head) is given Muon's lr 0.02 instead of its own 3e-3",
    "assignment_differs": "a Muon group's equal-shape matrices are ordered differently on rank 1 (built from a set): ranks update and gather different matrices per slot",
}
MUON_LR, ADAM_LR = 0.02, 3e-3


def newton_schulz(g: torch.Tensor, steps: int = 5) -> torch.Tensor:
    """The quintic Newton-Schulz iteration: an approximately orthogonal matrix with ``g``'s singular vectors."""
    a, b, c = (3.4445, -4.7750, 2.0315)
    x = g.mT if g.size(-2) > g.size(-1) else g
    x = x / (x.norm() + 1e-7)
    for _ in range(steps):
        A = x @ x.mT
        x = a * x + (b * A + c * A @ A) @ x
    return x.mT if g.size(-2) > g.size(-1) else x


def muon_update(grad, momentum, beta=0.95, bug=None):
    """The orthogonalised, shape-scaled update of one matrix (``momentum`` updated in place)."""
    if bug == "orthogonalised_before_momentum":
        g = newton_schulz(grad) * max(1, grad.size(-2) / grad.size(-1)) ** 0.5
        momentum.lerp_(g, 1 - beta)
        return g.lerp(momentum, beta)
    else:
        momentum.lerp_(grad, 1 - beta)
        update = momentum.clone() if bug == "nesterov_dropped" else grad.lerp(momentum, beta)
    update = newton_schulz(update)
    ratio = grad.size(-1) / grad.size(-2) if bug == "shape_scale_inverted" else grad.size(-2) / grad.size(-1)
    return update * max(1, ratio) ** 0.5


class MuonWithAuxAdam(torch.optim.Optimizer):
    """Muon for the ``use_muon`` group (round-robin over the ranks, then all_gather), AdamW for the others."""

    def __init__(self, groups, bug=None):
        self.bug = bug
        super().__init__(groups, {})

    def _muon(self, group):
        params, w, r = group["params"], world(), rank()
        if self.bug == "assignment_differs" and r == 1:
            params = params[::-1]  # the group's equal-size matrices, from a set, in another order
        pad = params + [torch.empty_like(params[-1])] * (w - len(params) % w)
        for base in range(0, len(params), w):
            if base + r < len(params):
                p = params[base + r]
                state = self.state[p]
                if not state:
                    state["momentum_buffer"] = torch.zeros_like(p)
                u = muon_update(p.grad, state["momentum_buffer"], group["momentum"], self.bug)
                p.add_(u, alpha=-group["lr"])
            if w > 1 and self.bug != "share_not_gathered":
                tdist.all_gather(pad[base:base + w], pad[base + r])

    def _adam(self, group):
        b1, b2 = group["betas"]
        for p in group["params"]:
            state = self.state[p]
            if not state:
                state.update(step=0, exp_avg=torch.zeros_like(p), exp_avg_sq=torch.zeros_like(p))
            state["step"] += 1
            state["exp_avg"].lerp_(p.grad, 1 - b1)
            state["exp_avg_sq"].lerp_(p.grad.square(), 1 - b2)
            m = state["exp_avg"] / (1 - b1 ** state["step"])
            v = state["exp_avg_sq"] / (1 - b2 ** state["step"])
            p.mul_(1 - group["lr"] * group["weight_decay"])
            p.add_(m / (v.sqrt() + group["eps"]), alpha=-group["lr"])

    @torch.no_grad()
    def step(self, closure=None):
        for group in self.param_groups:
            (self._muon if group["use_muon"] else self._adam)(group)


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.up = nn.Linear(D, H)
        self.down = nn.Linear(H, D)

    def forward(self, x):
        return x + self.down(F.relu(self.up(x)))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(SEED)
        self.embed = nn.Embedding(V, D)
        self.blocks = nn.Sequential(Block(), Block())
        self.head = nn.Linear(D, V)

    def forward(self, tokens):
        return self.head(self.blocks(self.embed(tokens).mean(1)))


def optimizer(model: Net, bug=None):
    hidden = [p for p in model.blocks.parameters() if p.ndim == 2]
    others = [p for p in model.parameters() if all(p is not q for q in hidden)]
    shapes = sorted({tuple(p.shape) for p in hidden}, reverse=True)
    adam = dict(params=others, lr=MUON_LR if bug == "adam_group_muon_lr" else ADAM_LR, betas=(0.9, 0.95),
                eps=1e-8, weight_decay=0.01, use_muon=False)
    muon = [dict(params=[p for p in hidden if tuple(p.shape) == s], lr=MUON_LR, momentum=0.95, use_muon=True)
            for s in shapes]
    return MuonWithAuxAdam([*muon, adam], bug)


def batch(step: int):
    g = gen(SEED + step)
    tokens = torch.randint(0, V, (GB, T), generator=g)
    target = (tokens[:, 0] + tokens[:, -1]) % V
    return tokens, target


def run(model, fwd, rows, bug=None) -> None:
    opt = optimizer(model, bug)
    for step in range(STEPS):
        tokens, target = (rows(t) for t in batch(step))
        loss = F.cross_entropy(fwd(tokens), target)
        opt.zero_grad()
        loss.backward()
        opt.step()


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: the network under DDP, its block of rows, the round-robin Muon."""
    r, lb = rank(), GB // world_size
    model = Net()
    run(model, DDP(model), lambda t: t[r * lb:(r + 1) * lb], bug)


def reference(world_size: int) -> None:
    """One device: the same optimizer, every matrix updated here, on the global batch."""
    model = Net()
    run(model, model, lambda t: t)
