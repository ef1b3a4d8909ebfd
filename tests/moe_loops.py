"""A mixture-of-experts loop under DDP as Mixtral-style code writes it (``tests/test_routed_tokens.py``):
the batch's tokens flattened (``view(-1, d)``), a top-1 router, each expert called on the tokens routed
to it (``expert(h[idx])``), a capacity per expert counted over the global batch (each rank's priorities
offset by the earlier ranks' counts), router noise drawn for the global batch. ``bug`` changes the ranks'
loop only: ``capacity_local`` counts the capacity and the priorities over the rank's own tokens;
``noise_per_rank`` draws the router noise from a seed of the rank's own; ``jitter_per_rank`` multiplies
the router's input by jitter from a seed of the rank's own. ``keywords``: the model is called
as a transformers model is, with keywords alone, and returns the loss it computes."""
import math

import torch
import torch.distributed as tdist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

D, E, T, B, STEPS = 8, 4, 6, 8, 3


class MoE(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.inp = nn.Linear(D, D)
        self.router = nn.Linear(D, E, bias=False)
        self.experts = nn.ModuleList(nn.Sequential(nn.Linear(D, 2 * D), nn.Tanh(), nn.Linear(2 * D, D))
                                     for _ in range(E))
        self.out = nn.Linear(D, 1)

    def forward(self, x, noise, offset, capacity, target=None, jitter=None):
        h = self.inp(x).reshape(-1, D)
        probs = (self.router(h if jitter is None else h * jitter) + noise).softmax(-1)
        top, idx = probs.max(-1)
        onehot = nn.functional.one_hot(idx, E)
        priority = (torch.cumsum(onehot, 0) + offset) * onehot
        keep = priority.sum(-1) <= capacity
        y = torch.zeros_like(h)
        for e, expert in enumerate(self.experts):
            at = torch.nonzero((idx == e) & keep).squeeze(-1)
            if at.numel():
                y = y.index_add(0, at, expert(h[at]) * top[at, None])
        pred = self.out(h + y).reshape(x.shape[:2])
        return (nn.functional.mse_loss(pred, target), onehot) if target is not None else (pred, onehot)


def batch(step: int):
    g = torch.Generator().manual_seed(70 + step)
    x = torch.randn(B, T, D, generator=g)
    return x, x[..., 0] * x[..., 1], 0.5 * torch.randn(B * T, E, generator=g)


def _loop(model, run, rows, counts, bug=None, keywords=False) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    capacity = math.ceil(1.0 * B * T / E)
    for step in range(STEPS):
        x, y, noise = batch(step)
        x, y, noise = rows(x), rows(y), rows(noise.reshape(B, T, E)).reshape(-1, E)
        if bug == "noise_per_rank":
            noise = 0.5 * torch.randn(noise.shape, generator=torch.Generator().manual_seed(1000 + tdist.get_rank()))
        with torch.no_grad():
            _, onehot = model(x, noise, 0, float("inf"))
        offset = counts(onehot.sum(0))
        cap = capacity
        if bug == "capacity_local":
            offset, cap = 0, math.ceil(1.0 * x.shape[0] * T / E)
        if keywords:  # as a transformers model is called: keywords only, the loss computed inside
            loss, _ = run(x=x, noise=noise, offset=offset, capacity=cap, target=y)
        else:  # jitter_per_rank: Switch-style jitter on the router's input, drawn from the rank's seed
            jitter = torch.empty(x.shape[0] * T, D).uniform_(0.8, 1.2, generator=torch.Generator().manual_seed(
                2000 + tdist.get_rank())) if bug == "jitter_per_rank" else None
            pred, _ = run(x, noise, offset, cap, jitter=jitter)
            loss = nn.functional.mse_loss(pred, y)
        loss.backward()
        opt.step()
        opt.zero_grad()


def train(world_size: int, bug=None, keywords=False) -> None:
    """A rank: its block of sequences; the earlier ranks' expert counts all-gathered for the priorities."""
    r, n = tdist.get_rank(), B // world_size
    model = MoE()

    def counts(local):
        every = [torch.zeros_like(local) for _ in range(world_size)]
        tdist.all_gather(every, local)
        return sum(every[:r], torch.zeros_like(local))
    _loop(model, DDP(model, find_unused_parameters=True), lambda t: t[r * n:(r + 1) * n], counts, bug, keywords)


def reference(world_size: int, keywords=False) -> None:
    model = MoE()
    _loop(model, model, lambda t: t, lambda c: torch.zeros_like(c), keywords=keywords)


class HandEP(nn.Module):
    """Experts split over the ranks by hand (``w`` stacks this rank's block of them), the router and the
    layers around them whole on each rank; a token goes to its top-1 expert, wherever it is held."""

    def __init__(self, world_size: int, rank: int = 0):
        super().__init__()
        torch.manual_seed(0)
        self.inp, self.router, self.out = nn.Linear(D, D), nn.Linear(D, E, bias=False), nn.Linear(D, 1)
        every = torch.randn(E, D, D) / D ** 0.5
        local = E // world_size
        self.w = nn.Parameter(every[rank * local:(rank + 1) * local].clone())
        self.first = rank * local

    def forward(self, x):
        import torch.distributed.nn.functional as dnn

        h = self.inp(x).reshape(-1, D)
        gate = self.router(h).softmax(-1)
        top, choice = gate.max(-1)
        spread = tdist.is_initialized() and tdist.get_world_size() > 1
        tokens = torch.cat(dnn.all_gather(h)) if spread else h  # every rank's tokens (gradients flow back)
        chosen = torch.cat(dnn.all_gather(choice)) if spread else choice
        y = torch.zeros_like(tokens)
        for i in range(self.w.shape[0]):
            at = (chosen == self.first + i).nonzero().squeeze(-1)
            y = y.index_add(0, at, tokens[at] @ self.w[i])
        if spread:  # every rank's experts' outputs summed; this rank keeps its own tokens'
            y = dnn.all_reduce(y).reshape(tdist.get_world_size(), -1, D)[tdist.get_rank()]
        return self.out(h + y * top[:, None]).reshape(x.shape[:2])


def ep_train(world_size: int, bug=None) -> None:
    """A rank: its block of sequences, its block of experts; the whole tensors' gradients all-reduced and
    divided by the world size, the experts' divided (each already sums every rank's tokens). ``bug``:
    ``router_unreduced`` leaves the router's gradient out of the all-reduce."""
    r, n = tdist.get_rank(), B // world_size
    model = HandEP(world_size, r)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(STEPS):
        x, y, _ = batch(step)
        nn.functional.mse_loss(model(x[r * n:(r + 1) * n]), y[r * n:(r + 1) * n]).backward()
        for name, p in model.named_parameters():
            if name != "w" and not (bug == "router_unreduced" and name.startswith("router")):
                tdist.all_reduce(p.grad)
            p.grad.div_(world_size)
        opt.step()
        opt.zero_grad()


def ep_reference(world_size: int) -> None:
    model = HandEP(1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(STEPS):
        x, y, _ = batch(step)
        nn.functional.mse_loss(model(x), y).backward()
        opt.step()
        opt.zero_grad()
