"""An expert-parallel MoE layer with top-2 routing and an all-to-all token exchange, by hand, inside a
data-parallel model. Each rank reads its own block of the global batch (its tokens are one routing
GROUP, as GShard's groups); the dense layers (``inp``, the router ``gate``, ``head``) are replicated and
their gradients all-reduced by hand and divided by W; the experts' weights are stacked (grouped-GEMM
layout: ``experts.w1`` ``[E, D, F]``, ``experts.b1`` ``[E, F]``, ``experts.w2`` ``[E, F, D]``) and each
rank holds the slice of ``E / W`` experts along dim 0, so rank r owns global experts
``[r E/W, (r+1) E/W)``.

Routing (per group of N tokens): softmax over the router logits, top-2, the two weights renormalised
to sum to 1; a capacity of ``ceil(CF * 2 * N / E)`` slots per expert; first choices take slots in
token order, second choices after ALL first choices (their positions offset by the first choices'
counts); tokens beyond capacity are dropped for that choice (the residual still carries them). The
dispatch buffer ``[E, cap, D]`` goes through ``all_to_all`` (chunk i to rank i), arrives as ``[W,
E/W, cap, D]`` (source rank major), each local expert runs on its ``W * cap`` rows, and the outputs
go back through the reverse ``all_to_all`` and are combined with the gate weights. The loss is the
group's mean cross entropy plus ``ALPHA`` times the GShard/Switch load-balancing loss (E * sum over
experts of the top-1 fraction times the mean router probability). An expert's gradient arrives summed
over every rank's loss, so it is divided by W like the all-reduced dense ones. SGD with momentum.

Follows microsoft/DeepSpeed ``deepspeed/moe/sharded_moe.py`` (``top2gating``: ``locations2 +=
torch.sum(mask1, dim=0, keepdim=True)``, capacity, ``l_aux``; ``_AllToAll``; ``MOELayer.forward``),
NVIDIA/Megatron-LM ``megatron/core/transformer/moe/token_dispatcher.py`` (``MoEAlltoAllTokenDispatcher``)
and ``moe/experts.py`` (``GroupedMLP``: the experts' weights stacked, a rank's slice by its expert-parallel
rank), HF ``modeling_mixtral.py`` (top-2, ``routing_weights /= routing_weights.sum(-1)``).
"""
from __future__ import annotations

import math

import torch
import torch.distributed as tdist
import torch.nn.functional as F
from torch import nn

from .common import all_to_all, gen, rank, world

DIN, D, F_HID, E, C, N = 6, 8, 12, 4, 3, 8
LR, MOMENTUM, CF, ALPHA, SEED = 0.3, 0.9, 1.0, 0.1, 31
STEPS = 5
CORRECT = {"default": (2, 4)}
BUGS = {
    "gate_not_allreduced": "the router gate's gradient is left out of the all-reduce (filtered out with the experts)",
    "experts_not_scaled": "the experts' gradients are not divided by W (they arrive summed over every rank's loss)",
    "dense_sum_not_mean": "the dense gradients are all-reduced (summed) but not divided by W",
    "no_renorm": "the top-2 gate weights are the raw softmax probabilities, not renormalised to sum to 1",
    "capacity_global": "the expert capacity computed from the global token count (N x W) instead of the group's N",
    "second_no_offset": "second-choice slots are not offset by the first choices' counts (they land on first-choice slots)",
    "a2a_wrong_view": "the received tokens viewed as [E/W, W, cap, D] (expert major) instead of [W, E/W, cap, D]",
}


class Experts(nn.Module):
    """``n`` experts' stacked weights (global experts ``first .. first + n - 1``)."""

    def __init__(self, n: int) -> None:
        super().__init__()
        self.w1 = nn.Parameter(torch.randn(n, D, F_HID) * D ** -0.5)
        self.b1 = nn.Parameter(torch.zeros(n, F_HID))
        self.w2 = nn.Parameter(torch.randn(n, F_HID, D) * F_HID ** -0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``x``: [n, rows, D] -> [n, rows, D], expert k on ``x[k]``."""
        return torch.relu(x @ self.w1 + self.b1.unsqueeze(1)) @ self.w2


class MoENet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(DIN, D)
        self.gate = nn.Linear(D, E, bias=False)
        self.experts = Experts(E)
        self.head = nn.Linear(D, C)
        self.bug: str | None = None

    def route(self, h: torch.Tensor, n_tokens: int):
        """Top-2 routing of one group: (expert ids [N, 2], slots [N, 2], weights [N, 2] (0 if dropped), aux)."""
        bug = self.bug
        probs = self.gate(h).softmax(-1)
        vals, idx = probs.topk(2, dim=-1)
        if bug != "no_renorm":
            vals = vals / vals.sum(-1, keepdim=True)
        mask1, mask2 = F.one_hot(idx[:, 0], E), F.one_hot(idx[:, 1], E)
        loc1 = mask1.cumsum(0) - 1
        loc2 = mask2.cumsum(0) - 1
        if bug != "second_no_offset":
            loc2 = loc2 + mask1.sum(0, keepdim=True)
        cap = math.ceil(CF * 2 * n_tokens / E)
        pos = torch.stack([(loc1 * mask1).sum(1), (loc2 * mask2).sum(1)], 1)
        kept = (pos < cap).to(vals.dtype)
        aux = E * (probs.mean(0) * mask1.to(probs.dtype).mean(0)).sum()
        return idx, pos.clamp(max=cap - 1), vals * kept, cap, aux

    def experts_run(self, buf: torch.Tensor) -> torch.Tensor:
        return self.experts(buf)

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """The loss of one routing group (``x``: its rows)."""
        h = torch.tanh(self.inp(x))
        n_tokens = x.shape[0] * (world() if self.bug == "capacity_global" else 1)
        idx, pos, wts, cap, aux = self.route(h, n_tokens)
        buf = torch.zeros(E, cap, D)
        for k in range(2):
            keep = wts[:, k] > 0
            buf = buf.index_put((idx[keep, k], pos[keep, k]), h[keep], accumulate=True)
        out = self.experts_run(buf)
        moe = sum(wts[:, k:k + 1] * out[idx[:, k], pos[:, k]] for k in range(2))
        return F.cross_entropy(self.head(h + moe), y) + ALPHA * aux


class EPNet(MoENet):
    """The rank's part: the dense layers, its ``E / W`` experts, the all-to-all exchange."""

    def __init__(self, bug: str | None) -> None:
        super().__init__()
        r, w = rank(), world()
        self.bug, self.local = bug, E // w
        sl = slice(r * self.local, (r + 1) * self.local)
        full = self.experts
        self.experts = Experts(self.local)
        for name in ("w1", "b1", "w2"):
            setattr(self.experts, name, nn.Parameter(getattr(full, name).detach()[sl].clone()))

    def experts_run(self, buf: torch.Tensor) -> torch.Tensor:
        w, e_loc = world(), self.local
        _, cap, _ = buf.shape
        got = all_to_all(buf)  # [W * E/W, cap, D]: rank j's tokens for my experts, rank-major
        if self.bug == "a2a_wrong_view":
            x = got.view(e_loc, w, cap, D).reshape(e_loc, w * cap, D)
            back = self.experts(x).view(e_loc, w, cap, D).reshape(E, cap, D)
        else:
            x = got.view(w, e_loc, cap, D).transpose(0, 1).reshape(e_loc, w * cap, D)
            back = self.experts(x).view(e_loc, w, cap, D).transpose(0, 1).reshape(E, cap, D)
        return all_to_all(back)


def global_batch(step: int, w: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = gen(700 + step)
    return torch.randn(N * w, DIN, generator=g), torch.randint(0, C, (N * w,), generator=g)


def sync_grads(model: EPNet, bug: str | None) -> None:
    w = world()
    for name, p in model.named_parameters():
        if name.startswith("experts."):
            if bug != "experts_not_scaled":
                p.grad /= w
            continue
        if bug == "gate_not_allreduced" and name.startswith("gate."):
            continue
        tdist.all_reduce(p.grad)
        if bug != "dense_sum_not_mean":
            p.grad /= w


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: its block of rows (one routing group), its experts."""
    torch.manual_seed(SEED)
    model = EPNet(bug)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    r, w = rank(), world_size
    for step in range(STEPS):
        x, y = global_batch(step, w)
        opt.zero_grad()
        model(x.chunk(w)[r], y.chunk(w)[r]).backward()
        sync_grads(model, bug)
        opt.step()


def reference(world_size: int) -> None:
    """One device: every expert; the global batch routed group by group (a group per rank block)."""
    torch.manual_seed(SEED)
    model = MoENet()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    for step in range(STEPS):
        x, y = global_batch(step, world_size)
        opt.zero_grad()
        loss = sum(model(xb, yb) for xb, yb in zip(x.chunk(world_size), y.chunk(world_size)))
        (loss / world_size).backward()
        opt.step()
