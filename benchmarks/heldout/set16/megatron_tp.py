"""Megatron-style tensor parallelism written by hand: one pre-LayerNorm transformer block whose attention
has its heads split over the ranks (column-parallel ``q``, ``k``, ``v``: each rank the rows of its heads;
row-parallel output projection: the columns of its heads, its partial sums all-reduced, the bias added
once after the reduce) and whose MLP is column-parallel ``fc1`` (rows and bias sharded) then GELU then
row-parallel ``fc2``. The parallel regions are entered through ``f`` (identity forward, all-reduce
backward) and left through ``g`` (all-reduce forward, identity backward); the LayerNorms and the token
classifier head are replicated, their gradients already equal on every rank. Every rank sees the same
batch (no data parallelism), the loss is the token cross entropy, SGD with momentum. The shards are cut
from the master weights built on one device from one seed (``_initialize_affine_weight_cpu``), so the
reference is the unsharded block.

Follows NVIDIA/Megatron-LM ``megatron/core/tensor_parallel/mappings.py`` (``_CopyToModelParallelRegion``,
``_ReduceFromModelParallelRegion``), ``tensor_parallel/layers.py`` (``ColumnParallelLinear``,
``RowParallelLinear``: ``skip_bias_add`` / the bias added after the all-reduce,
``_initialize_affine_weight_cpu``), ``transformer/attention.py`` (``num_attention_heads_per_partition =
divide(num_attention_heads, world_size)``) and the Megatron-LM paper (Shoeybi et al. 2019, Fig. 3: the
``f`` and ``g`` operators).
"""
from __future__ import annotations

import math

import torch
import torch.distributed as tdist
import torch.nn.functional as F
from torch import nn

from .common import gen, rank

B, S, D, NH, FF, C, SEED = 4, 6, 16, 4, 32, 5, 1622
LR, MOMENTUM = 0.2, 0.9
STEPS = 6
CORRECT = {"default": (2, 4)}
BUGS = {
    "f_no_allreduce_bwd": "the f operator entering the parallel regions is a plain identity in backward too: the input gradient is not all-reduced, the LayerNorms and earlier layers see only the rank's heads / columns",
    "g_allreduce_bwd_too": "the g operator leaving the parallel regions all-reduces in backward as well: the gradients inside the regions are W times too large",
    "row_bias_before_reduce": "the row-parallel layers add their (replicated) bias before the all-reduce: the bias is counted W times",
    "num_heads_not_divided": "the attention reshapes the rank's q/k/v into the global number of heads (not divided by the tensor-parallel size): wrong head width and softmax scale",
    "replicated_grad_allreduced": "the replicated parameters' gradients (LayerNorms, head) are all-reduced (summed) over the tensor-parallel ranks as if they were data parallel: W times too large",
    "shard_init_same_seed": "every rank initialises its shards from the same seed instead of slicing the master weights: the shards are copies of one another",
    "attn_out_not_reduced": "the attention output projection's partial sums are not all-reduced (g missing after the row-parallel layer): each rank keeps its heads' share only",
}


def _ar(t):
    t = t.clone()
    tdist.all_reduce(t)
    return t


class _F(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, reduce_bwd):
        ctx.reduce_bwd = reduce_bwd
        return x.view_as(x)

    @staticmethod
    def backward(ctx, g):
        return (_ar(g) if ctx.reduce_bwd else g), None


class _G(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, reduce_bwd):
        ctx.reduce_bwd = reduce_bwd
        return _ar(x)

    @staticmethod
    def backward(ctx, g):
        return (_ar(g) if ctx.reduce_bwd else g), None


def master():
    """The full weights, from one seed (as the one-device model's)."""
    g = gen(SEED)
    w = lambda o, i: torch.randn(o, i, generator=g) / math.sqrt(i)
    b = lambda o: torch.randn(o, generator=g) * 0.1
    return {"q": (w(D, D), b(D)), "k": (w(D, D), b(D)), "v": (w(D, D), b(D)), "o": (w(D, D), b(D)),
            "fc1": (w(FF, D), b(FF)), "fc2": (w(D, FF), b(D)), "head": (w(C, D), b(C))}


class Block(nn.Module):
    """tp ranks; this rank's shards (tp=1: the full block)."""

    def __init__(self, tp: int = 1, r: int = 0, bug=None):
        super().__init__()
        self.tp, self.bug = tp, bug
        m = master()
        if bug == "shard_init_same_seed":
            g = gen(SEED + 7)
            m = {k: (torch.randn(*wt.shape, generator=g) / math.sqrt(wt.shape[1]), torch.randn(*bs.shape, generator=g) * 0.1)
                 for k, (wt, bs) in m.items()}
            col = lambda k: (m[k][0].chunk(tp, 0)[0], m[k][1].chunk(tp, 0)[0])
            row = lambda k: (m[k][0].chunk(tp, 1)[0], m[k][1])
        else:
            col = lambda k: (m[k][0].chunk(tp, 0)[r], m[k][1].chunk(tp, 0)[r])
            row = lambda k: (m[k][0].chunk(tp, 1)[r], m[k][1])
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        for name, (wt, bs) in [("q", col("q")), ("k", col("k")), ("v", col("v")), ("o", row("o")),
                               ("fc1", col("fc1")), ("fc2", row("fc2")), ("head", m["head"])]:
            lin = nn.Linear(wt.shape[1], wt.shape[0])
            with torch.no_grad():
                lin.weight.copy_(wt)
                lin.bias.copy_(bs)
            setattr(self, name, lin)

    def enter(self, x):
        return _F.apply(x, self.bug != "f_no_allreduce_bwd") if self.tp > 1 else x

    def leave(self, lin, h, reduce=True):
        """Row-parallel: partial matmul, all-reduce (g), then the bias once."""
        if self.tp == 1:
            return lin(h)
        if self.bug == "row_bias_before_reduce":
            return _G.apply(F.linear(h, lin.weight, lin.bias), self.bug == "g_allreduce_bwd_too")
        part = F.linear(h, lin.weight)
        if reduce:
            part = _G.apply(part, self.bug == "g_allreduce_bwd_too")
        return part + lin.bias

    def forward(self, x):
        h = self.enter(self.ln1(x))
        heads = NH if self.bug == "num_heads_not_divided" else NH // self.tp
        q, k, v = (t.view(B, S, heads, -1).transpose(1, 2) for t in (self.q(h), self.k(h), self.v(h)))
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), -1) @ v
        att = att.transpose(1, 2).reshape(B, S, -1)
        x = x + self.leave(self.o, att, reduce=self.bug != "attn_out_not_reduced")
        h = self.enter(self.ln2(x))
        x = x + self.leave(self.fc2, F.gelu(self.fc1(h)))
        return self.head(x)


def batch(step: int):
    g = gen(SEED + 1 + step)
    return torch.randn(B, S, D, generator=g), torch.randint(0, C, (B, S), generator=g)


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: its heads / columns / rows of the block, the same batch."""
    w = world_size
    model = Block(w, rank(), bug)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    replicated = [p for n, p in model.named_parameters() if n.startswith(("ln", "head", "o.bias", "fc2.bias"))]
    for step in range(STEPS):
        x, y = batch(step)
        loss = F.cross_entropy(model(x).reshape(-1, C), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        if bug == "replicated_grad_allreduced":
            for p in replicated:
                tdist.all_reduce(p.grad)
        opt.step()


def reference(world_size: int) -> None:
    """One device: the unsharded block."""
    model = Block()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    for step in range(STEPS):
        x, y = batch(step)
        loss = F.cross_entropy(model(x).reshape(-1, C), y.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
