"""A Switch-Transformer top-1 MoE layer with expert parallelism written by hand: a replicated router (with
multiplicative jitter noise on its input, drawn for the global batch), top-1 gate = the chosen expert's
softmax probability, 4 experts (GELU MLPs, stacked ``[E, ...]`` parameters) in blocks over the ranks, an
expert capacity ``ceil(capacity_factor * tokens / E)`` counted over the global batch (tokens keep their
global order: a token's position in its expert is the count on the earlier ranks, from an all-gather of
the per-expert counts, plus its place on its rank; tokens past the capacity are dropped and pass through
the residual only), a ``[E, capacity, D]`` dispatch buffer exchanged with an autograd ``all_to_all``, the
expert outputs sent back the same way and combined with the gate, and the Switch load-balancing loss
``alpha * E * sum_e f_e * P_e`` (``f_e``: the global fraction of tokens whose top-1 is ``e``, from the
all-reduced counts; ``P_e``: the rank's mean router probability, the global mean being the mean over the
ranks). The replicated router's gradients are all-reduced and divided by W, the experts' divided by W
(each rank's loss is a mean over its own tokens). The task is a regression (MSE) to a fixed function of
the tokens; SGD with momentum. The reference runs the 16 tokens on one device with the same capacity.

Follows google-research/t5x / mesh ``moe.py`` and HF transformers ``models/switch_transformers/
modeling_switch_transformers.py`` (``SwitchTransformersTop1Router``: jitter noise, ``router_probs.max``,
``expert_capacity``, ``cumsum`` of the one-hot mask, ``load_balancing_loss_func``: ``num_experts *
sum(tokens_per_expert * router_prob_per_expert)``), fairseq ``moe_layer.py`` / DeepSpeed
``deepspeed/moe/sharded_moe.py`` (``_AllToAll``, ``top1gating``, the ``[E, capacity, D]`` dispatch and the
``reshape(world, E_local, capacity, D)`` of the received tokens) and Megatron-LM ``moe/token_dispatcher.py``.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as tdist
import torch.nn.functional as F
from torch import nn

from .common import all_gather, all_to_all, gen, rank

D, FF, E, GB, CF, SEED = 8, 16, 4, 16, 1.0, 1655
LR, MOMENTUM, ALPHA, JITTER = 0.3, 0.9, 0.1, 0.1
STEPS = 6
CORRECT = {"default": (2, 4)}
BUGS = {
    "capacity_from_local_batch": "the expert capacity and the tokens' positions are computed from the rank's own tokens (ceil(cf * local tokens / E), local cumsum) instead of the global batch: other tokens are dropped",
    "aux_f_local": "the load-balancing loss's token fraction per expert (f_e) is counted over the rank's tokens instead of the all-reduced global counts",
    "aux_missing_num_experts": "the load-balancing loss omits the num_experts factor (alpha * sum f*P instead of alpha * E * sum f*P): the auxiliary loss is E times too weak",
    "router_grads_summed": "the replicated router's gradients are all-reduced (summed) but not divided by the world size: W times too large",
    "combine_without_gate": "the expert outputs are combined without multiplying by the gate probability: the router gets no gradient from the task loss",
    "recv_reshape_without_transpose": "the received tokens [W, E_local, capacity, D] are reshaped straight to [E_local, W * capacity, D] without the transpose: tokens are processed by the wrong local expert",
    "jitter_seed_per_rank": "the router's jitter noise is drawn from a rank-seeded generator instead of the rank's rows of the global per-step draw",
}


class MoE(nn.Module):
    """The experts ``lo:hi`` of the 4 (stacked), a replicated router."""

    def __init__(self, lo: int = 0, hi: int = E):
        super().__init__()
        g = gen(SEED)
        self.router = nn.Linear(D, E, bias=False)
        with torch.no_grad():
            self.router.weight.copy_(torch.randn(E, D, generator=g) * 0.5)
        self.w1 = nn.Parameter((torch.randn(E, D, FF, generator=g) / math.sqrt(D))[lo:hi])
        self.b1 = nn.Parameter((torch.randn(E, FF, generator=g) * 0.1)[lo:hi])
        self.w2 = nn.Parameter((torch.randn(E, FF, D, generator=g) / math.sqrt(FF))[lo:hi])

    def experts(self, h):
        """h: [E_local, n, D]."""
        return torch.bmm(F.gelu(torch.bmm(h, self.w1) + self.b1[:, None]), self.w2)

    def forward(self, x, noise, w=1, r=0, bug=None):
        probs = torch.softmax(self.router(x * noise), -1)
        gate, idx = probs.max(-1)
        onehot = F.one_hot(idx, E)
        counts = onehot.sum(0)
        pos = (onehot.cumsum(0) - 1).gather(1, idx[:, None])[:, 0]
        if w > 1 and bug != "capacity_from_local_batch":
            allc = all_gather(counts[None])
            pos = pos + allc[:r].sum(0)[idx]
            counts_g = allc.sum(0)
        else:
            counts_g = all_gather(counts[None]).sum(0) if w > 1 else counts
        cap = math.ceil(CF * (x.shape[0] if bug == "capacity_from_local_batch" else GB) / E)
        keep = pos < cap
        slot = idx * cap + pos.clamp(max=cap - 1)
        send = torch.zeros(E * cap, D).index_copy(0, slot[keep], x[keep])
        el = E // w
        if w > 1:
            recv = all_to_all(send)
            if bug == "recv_reshape_without_transpose":
                out = self.experts(recv.view(el, w * cap, D)).reshape(-1, D)
            else:
                h = recv.view(w, el, cap, D).transpose(0, 1).reshape(el, w * cap, D)
                out = self.experts(h).view(el, w, cap, D).transpose(0, 1).reshape(-1, D)
            back = all_to_all(out)
        else:
            back = self.experts(send.view(E, cap, D)).reshape(-1, D)
        y = back[slot] * keep[:, None]
        if bug != "combine_without_gate":
            y = y * gate[:, None]
        f = (counts / x.shape[0]) if bug == "aux_f_local" else counts_g / GB
        aux = ALPHA * (1 if bug == "aux_missing_num_experts" else E) * (f.float() * probs.mean(0)).sum()
        return x + y, aux


def batch(step: int):
    g = gen(SEED + 1 + step)
    x = torch.randn(GB, D, generator=g)
    noise = 1 + JITTER * (2 * torch.rand(GB, D, generator=g) - 1)
    target = torch.tanh(x @ torch.randn(D, D, generator=gen(SEED - 1)))
    return x, noise, target


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: its experts' block, the router replicated, its rows of each global batch."""
    r, w = rank(), world_size
    el, lb = E // w, GB // w
    model = MoE(r * el, (r + 1) * el)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    for step in range(STEPS):
        x, noise, target = (t[r * lb:(r + 1) * lb] for t in batch(step))
        if bug == "jitter_seed_per_rank":
            noise = 1 + JITTER * (2 * torch.rand(lb, D, generator=gen(SEED * 3 + step * 17 + r)) - 1)
        out, aux = model(x, noise, w, r, bug)
        loss = F.mse_loss(out, target) + aux
        opt.zero_grad()
        loss.backward()
        tdist.all_reduce(model.router.weight.grad)
        if bug != "router_grads_summed":
            model.router.weight.grad /= w
        for p in (model.w1, model.b1, model.w2):
            p.grad /= w
        opt.step()


def reference(world_size: int) -> None:
    """One device: every expert, the 16 tokens, the same global capacity."""
    model = MoE()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    for step in range(STEPS):
        x, noise, target = batch(step)
        out, aux = model(x, noise)
        loss = F.mse_loss(out, target) + aux
        opt.zero_grad()
        loss.backward()
        opt.step()
