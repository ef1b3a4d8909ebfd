"""An expert-parallel MoE layer by hand with DeepSeek-V3's auxiliary-loss-free load balancing: sigmoid
affinities from a replicated router, the top-2 experts chosen on the affinities plus a per-expert bias
(a buffer), the gate weights the chosen UNBIASED affinities normalised to sum 1; a replicated shared
expert added. The 4 routed experts are split in blocks over the ranks (rank r holds experts
``[r E/W, (r+1) E/W)``, their weights stacked as ``w1``/``w2``); each rank's tokens are dispatched
into ``[E, capacity, D]`` slots (GShard positions by ``cumsum``; the capacity is the rank's token count,
so no token is dropped) and exchanged with an autograd ``all_to_all`` there and back. The gradients
of the replicated parameters are all-reduced and divided by W by hand; the experts' gradients (every
rank's tokens already sent them theirs) are divided by W. After each step the bias moves by
``u * sign(mean load - load)`` with the load counted over the global batch (all-reduced). SGD momentum.
Tokens and labels are drawn for the global batch by a generator seeded per step; each rank keeps its rows.

The one-device reference: the same layer with all experts on one device and the global batch.

Follows deepseek-ai/DeepSeek-V3 ``inference/model.py`` (``Gate``: ``scores.sigmoid()``, ``scores +
self.bias`` for the choice only, ``weights = original_scores.gather(1, indices)``, ``weights /=
weights.sum(-1, keepdim=True)``; ``MoE``: ``n_local_experts``, ``experts_start_idx``, the shared
experts), the DeepSeek-V3 report section 2.1.2 (bias update speed gamma), NVIDIA/Megatron-LM
``moe/router.py`` (``_apply_expert_bias``, ``local_tokens_per_expert`` all-reduced in
``moe_utils.get_updated_expert_bias``) and ``moe/token_dispatcher.py`` (all-to-all dispatch).
"""
from __future__ import annotations

import torch
import torch.distributed as tdist
import torch.nn.functional as F
from torch import nn

from .common import all_reduce, all_to_all, gen, rank, world

D, FF, C, E, K, GB, SEED = 8, 16, 4, 4, 2, 16, 163
LR, MOMENTUM, GAMMA = 0.3, 0.9, 0.2
STEPS = 8
CORRECT = {"default": (2, 4)}
BUGS = {
    "load_counted_locally": "the bias update uses the rank's own tokens-per-expert counts (not all-reduced): the biases and routing differ per rank",
    "bias_in_gate_weights": "the gate weights are taken from the biased scores (affinity + bias) instead of the unbiased affinities",
    "expert_grads_not_divided": "the routed experts' gradients are not divided by the world size (the replicated ones are averaged)",
    "router_grads_not_allreduced": "the hand-written gradient all-reduce skips the router weight: each rank steps its router on its own tokens",
    "dispatch_without_autograd": "the tokens are dispatched with a plain all_to_all (no autograd): no gradient flows back to the router input through the experts",
    "expert_rank_round_robin": "tokens for expert e are sent to rank e % W, while rank r holds the block of experts r*E/W..: tokens reach the wrong experts",
    "bias_update_sign_flipped": "the bias moves by u * sign(load - mean load): overloaded experts are favoured",
}


class _Plain(torch.autograd.Function):
    """The all_to_all without a backward exchange (the bug ``dispatch_without_autograd``)."""

    @staticmethod
    def forward(ctx, x):
        return all_to_all(x.detach())

    @staticmethod
    def backward(ctx, g):
        return torch.zeros_like(g)


class MoEModel(nn.Module):
    def __init__(self, w: int):
        super().__init__()
        torch.manual_seed(SEED)
        self.inp = nn.Linear(D, D)
        self.router = nn.Linear(D, E, bias=False)
        self.shared = nn.Linear(D, D)
        w1, w2 = torch.randn(E, D, FF) / D ** 0.5, torch.randn(E, FF, D) / FF ** 0.5
        self.head = nn.Linear(D, C)
        el, r = E // w, rank() if w > 1 else 0
        self.w1 = nn.Parameter(w1[r * el:(r + 1) * el].clone())
        self.w2 = nn.Parameter(w2[r * el:(r + 1) * el].clone())
        self.register_buffer("bias", torch.zeros(E))
        self.w, self.bug, self.load = w, None, None

    def forward(self, x):
        h = torch.tanh(self.inp(x))
        t = h.shape[0]
        scores = torch.sigmoid(self.router(h))
        idx = (scores + self.bias).topk(K, -1).indices
        wts = (scores + self.bias if self.bug == "bias_in_gate_weights" else scores).gather(1, idx)
        wts = wts / wts.sum(-1, keepdim=True)
        mask = F.one_hot(idx, E).sum(1).float()                               # (T, E)
        gate = torch.zeros(t, E).scatter(1, idx, wts)                           # (T, E)
        pos = (torch.cumsum(mask, 0) - 1) * mask
        disp = mask[..., None] * F.one_hot(pos.long(), t).float()               # (T, E, cap = T)
        self.load = mask.sum(0).detach()
        xin = torch.einsum("tec,td->ecd", disp, h)                              # (E, cap, D)
        order = torch.arange(E)
        if self.bug == "expert_rank_round_robin":
            order = torch.cat([torch.arange(i, E, self.w) for i in range(self.w)])
        xin = xin[order]
        a2a = _Plain.apply if self.bug == "dispatch_without_autograd" and self.w > 1 else all_to_all
        el = E // self.w
        recv = a2a(xin).view(self.w, el, t, D).transpose(0, 1).reshape(el, self.w * t, D)
        out = torch.bmm(F.gelu(torch.bmm(recv, self.w1)), self.w2)
        back = all_to_all(out.view(el, self.w, t, D).transpose(0, 1).reshape(E, t, D))
        back = back[torch.argsort(order)]
        y = torch.einsum("tec,ecd->td", disp * gate[..., None], back)
        return self.head(h + self.shared(h) + y)


def batch(step: int, r: int, w: int):
    g = gen(SEED + step)
    y = torch.randint(0, C, (GB,), generator=g)
    x = torch.randn(GB, D, generator=g) + F.one_hot(y * 2, D).float() * 1.5
    lb = GB // w
    return x[r * lb:(r + 1) * lb], y[r * lb:(r + 1) * lb]


def run(model: MoEModel, r: int, w: int, bug=None) -> None:
    model.bug = bug
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    for step in range(STEPS):
        x, y = batch(step, r, w)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        for n, p in model.named_parameters():
            if n in ("w1", "w2"):
                if bug != "expert_grads_not_divided":
                    p.grad /= w
            elif w > 1 and not (bug == "router_grads_not_allreduced" and n == "router.weight"):
                tdist.all_reduce(p.grad)
                p.grad /= w
            else:
                p.grad /= w
        opt.step()
        load = model.load if bug == "load_counted_locally" else all_reduce(model.load)
        sign = torch.sign(load - load.mean()) if bug == "bias_update_sign_flipped" else torch.sign(load.mean() - load)
        model.bias += GAMMA * sign


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: its block of experts, the replicated rest, its rows of every global batch."""
    run(MoEModel(world_size), rank(), world_size, bug)


def reference(world_size: int) -> None:
    """One device: every expert, the global batch."""
    run(MoEModel(1), 0, 1)
