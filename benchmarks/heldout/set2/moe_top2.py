"""An expert-parallel MoE layer with GShard top-2 gating and a capacity factor; tokens dispatched
with variable-size ``all_to_all_single`` (only the kept assignments are sent).

Follows microsoft/DeepSpeed ``deepspeed/moe/sharded_moe.py`` (``top2gating``: softmax gates, the first
expert by argmax, the second by argmax of the logits with the first masked out, ``capacity =
ceil(num_tokens / num_experts * capacity_factor * 2)``, ``locations2`` offset by the first choices'
counts, ``l_aux = mean(me * ce) * E * E`` from the first choices, assignments past capacity dropped,
the two gate values renormalized; ``MOELayer`` sending each group's tokens to the experts' owners
through an autograd all-to-all) and Megatron-LM ``megatron/core/transformer/moe/token_dispatcher.py``
(``MoEAlltoAllTokenDispatcher``: the tokens sorted by destination, counts exchanged first, then
``all_to_all`` with ``input_split_sizes`` / ``output_split_sizes``, the reverse on the way back).
Every rank holds ``EXPERTS_PER_RANK`` consecutive experts and a replicated dense part (input
projection, router, output projection), and is its own token group. Gradients by hand: the dense
part's all-reduced and averaged; an expert's already summed over every group's tokens by the
all-to-all backward, so divided by the world size only. The one-device reference holds all experts
and routes the same W token groups one after the other, the loss the mean of the groups'.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as tdist
import torch.nn.functional as F
from torch import nn

from ..set1.common import block, rank, regress_rows

IN, D, H, OUT, TOKENS = 6, 8, 16, 4, 8
EXPERTS_PER_RANK, CAPACITY_FACTOR, AUX, LR, MOMENTUM = 2, 1.0, 0.01, 0.1, 0.9
STEPS = 5
CORRECT = {"default": (2, 4)}
BUGS = {
    "expert_grads_allreduced": "expert gradients all-reduced and averaged with the dense ones: expert i mixed with the experts of the same local index on other ranks",
    "expert_grads_not_scaled": "expert gradients not divided by the world size after the all-to-all backward summed every group's",
    "gate_not_reduced": "parameters split by 'moe' in the name: the router (moe.wg) lands among the experts and is never all-reduced",
    "plain_all_to_all": "torch.distributed.all_to_all_single (no autograd) in place of the differentiable one: expert outputs detached",
    "striped_owner": "tokens sent to rank expert % W (striped placement) while experts are placed in consecutive blocks",
    "capacity_global": "capacity computed from the global token count (tokens * world size) instead of the group's",
    "experts_same_init": "each rank builds its EXPERTS_PER_RANK local experts itself: every rank holds copies of experts 0..k-1",
}


class Expert(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(D, H)
        self.fc2 = nn.Linear(H, D)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class MoE(nn.Module):
    """The router ``wg`` and the experts this process holds, keyed by their global index."""

    def __init__(self, num_experts: int, local: range | None = None, build_local_only: bool = False):
        super().__init__()
        self.num_experts = num_experts
        self.wg = nn.Linear(D, num_experts, bias=False)
        ids = range(num_experts) if local is None else local
        if build_local_only:
            built = {i: Expert() for i in ids}
        else:
            every = [Expert() for _ in range(num_experts)]
            built = {i: every[i] for i in ids}
        self.experts = nn.ModuleDict({str(i): m for i, m in built.items()})


class Net(nn.Module):
    """The dense part built first, the router and experts last (every side draws them in the same order)."""

    def __init__(self, num_experts: int, local: range | None = None, build_local_only: bool = False):
        super().__init__()
        self.inp = nn.Linear(IN, D)
        self.out = nn.Linear(D, OUT)
        self.moe = MoE(num_experts, local, build_local_only)

    def forward(self, x: torch.Tensor, t: torch.Tensor, moe_fn) -> torch.Tensor:
        """The group's loss; ``moe_fn(h)`` runs the MoE layer (expert-parallel or local)."""
        h = torch.tanh(self.inp(x))
        m, l_aux = moe_fn(h)
        return F.mse_loss(self.out(h + m), t) + AUX * l_aux


def top2gating(logits: torch.Tensor, capacity: int):
    """DeepSpeed's top2gating without noise: kept assignments as (token, expert, weight) and l_aux."""
    gates = F.softmax(logits, dim=1)
    s, e = gates.shape
    idx1 = torch.argmax(gates, dim=1)
    mask1 = F.one_hot(idx1, e)
    idx2 = torch.argmax(logits.masked_fill(mask1.bool(), float("-inf")), dim=1)
    mask2 = F.one_hot(idx2, e)
    loc1 = torch.cumsum(mask1, 0) - 1
    loc2 = torch.cumsum(mask2, 0) - 1 + mask1.sum(0, keepdim=True)
    l_aux = torch.mean(gates.mean(0) * mask1.float().mean(0)) * e * e
    mask1 = mask1 * (loc1 < capacity)
    mask2 = mask2 * (loc2 < capacity)
    g1 = (gates * mask1).sum(1)
    g2 = (gates * mask2).sum(1)
    denom = torch.clamp(g1 + g2, min=torch.finfo(gates.dtype).eps)
    g1, g2 = g1 / denom, g2 / denom
    keep1, keep2 = mask1.sum(1) > 0, mask2.sum(1) > 0
    tokens = torch.arange(s)
    return (torch.cat([tokens[keep1], tokens[keep2]]), torch.cat([idx1[keep1], idx2[keep2]]),
            torch.cat([g1[keep1], g2[keep2]]), l_aux)


def capacity_of(num_tokens: int, num_experts: int) -> int:
    return math.ceil(num_tokens / num_experts * CAPACITY_FACTOR * 2)


def moe_forward_ep(net: Net, h: torch.Tensor, world: int, bug: str | None):
    """The expert-parallel MoE layer on this rank's token group."""
    from torch.distributed.nn.functional import all_to_all_single as a2a_autograd

    e = net.moe.num_experts
    s = h.shape[0]
    cap = capacity_of(s * world if bug == "capacity_global" else s, e)
    tok, exp, w, l_aux = top2gating(net.moe.wg(h), cap)
    owner = exp % world if bug == "striped_owner" else exp // EXPERTS_PER_RANK
    order = torch.argsort(owner * e + exp, stable=True)
    tok, exp, w, owner = tok[order], exp[order], w[order], owner[order]
    send_counts = torch.bincount(owner, minlength=world)
    recv_counts = torch.empty_like(send_counts)
    tdist.all_to_all_single(recv_counts, send_counts)
    send, recv = send_counts.tolist(), recv_counts.tolist()
    recv_exp = torch.empty(sum(recv), dtype=exp.dtype)
    tdist.all_to_all_single(recv_exp, exp, recv, send)
    send_x = h[tok]
    if bug == "plain_all_to_all":
        recv_x = torch.empty(sum(recv), D)
        tdist.all_to_all_single(recv_x, send_x.detach(), recv, send)
    else:
        recv_x = a2a_autograd(torch.empty(sum(recv), D), send_x, recv, send)
    local = recv_exp // world if bug == "striped_owner" else recv_exp - rank() * EXPERTS_PER_RANK
    out = torch.zeros(sum(recv), D)
    for le, expert in enumerate(net.moe.experts.values()):
        idx = torch.nonzero(local == le).flatten()
        out = out.index_copy(0, idx, expert(recv_x[idx]))
    if bug == "plain_all_to_all":
        back = torch.empty(sum(send), D)
        tdist.all_to_all_single(back, out.detach(), send, recv)
    else:
        back = a2a_autograd(torch.empty(sum(send), D), out, send, recv)
    return torch.zeros(s, D).index_add(0, tok, back * w[:, None]), l_aux


def moe_forward_local(net: Net, h: torch.Tensor):
    """All experts in one process, one token group."""
    e = net.moe.num_experts
    tok, exp, w, l_aux = top2gating(net.moe.wg(h), capacity_of(h.shape[0], e))
    y = torch.zeros(len(tok), D)
    for name, expert in net.moe.experts.items():
        idx = torch.nonzero(exp == int(name)).flatten()
        y = y.index_copy(0, idx, expert(h[tok[idx]]))
    return torch.zeros(h.shape[0], D).index_add(0, tok, y * w[:, None]), l_aux


def global_batch(step: int, world: int) -> tuple[torch.Tensor, torch.Tensor]:
    return regress_rows(808 + step, TOKENS * world, IN, OUT)


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: its experts and the replicated dense part; SGD with momentum."""
    e = EXPERTS_PER_RANK * world_size
    local = range(rank() * EXPERTS_PER_RANK, (rank() + 1) * EXPERTS_PER_RANK)
    net = Net(e, local, build_local_only=bug == "experts_same_init")
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM)
    if bug == "gate_not_reduced":
        expert_params = [p for n, p in net.named_parameters() if "moe" in n]
    else:
        expert_params = list(net.moe.experts.parameters())
    ids = {id(p) for p in expert_params}
    dense_params = [p for p in net.parameters() if id(p) not in ids]
    for step in range(STEPS):
        x, t = (block(z, rank(), world_size) for z in global_batch(step, world_size))
        opt.zero_grad()
        loss = net(x, t, lambda h: moe_forward_ep(net, h, world_size, bug))
        loss.backward()
        for p in dense_params:
            tdist.all_reduce(p.grad)
            p.grad.div_(world_size)
        for p in expert_params:
            if p.grad is None:
                continue
            if bug == "expert_grads_allreduced":
                tdist.all_reduce(p.grad)
            if bug != "expert_grads_not_scaled":
                p.grad.div_(world_size)
        opt.step()


def reference(world_size: int) -> None:
    """One device: all experts; the W token groups routed one by one, the loss their mean."""
    net = Net(EXPERTS_PER_RANK * world_size)
    opt = torch.optim.SGD(net.parameters(), lr=LR, momentum=MOMENTUM)
    for step in range(STEPS):
        x, t = global_batch(step, world_size)
        opt.zero_grad()
        losses = [net(x.chunk(world_size)[r], t.chunk(world_size)[r], lambda h: moe_forward_local(net, h))
                  for r in range(world_size)]
        torch.stack(losses).mean().backward()
        opt.step()
