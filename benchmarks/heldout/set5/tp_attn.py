"""Megatron-style tensor-parallel self-attention written by hand, heads split across ranks: separate
q/k/v projections (HF LLaMA's ``q_proj``/``k_proj``/``v_proj``/``o_proj`` names) each column-parallel
(rank r holds the rows of heads ``r*NH/W .. (r+1)*NH/W``), the output projection row-parallel (its
columns block; bias replicated, added after the all-reduce), causal softmax attention over the rank's
heads, LayerNorm before and a residual around, under an input projection and a head. Each rank slices
the same full initialisation; every rank reads the same rows; SGD with momentum.

Follows NVIDIA/Megatron-LM ``megatron/core/transformer/attention.py`` (``num_attention_heads_per_
partition = divide(num_attention_heads, world_size)``, ``hidden_size_per_attention_head =
divide(projection_size, num_attention_heads)``; q/k/v through ``ColumnParallelLinear``, the dense
output through ``RowParallelLinear``), ``tensor_parallel/mappings.py`` (copy-to-region before the
projections, reduce-from-region after) and HF transformers ``modeling_llama.py`` (``view(bsz, q_len,
num_heads, head_dim)``, scores scaled by ``head_dim ** -0.5``).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .common import copy_to, gen, rank, reduce_from, world

DIN, D, NH, OUT, B, T = 6, 8, 4, 3, 4, 5
HD = D // NH
LR, MOMENTUM = 0.1, 0.9
STEPS = 5
CORRECT = {"default": (2, 4)}
BUGS = {
    "heads_not_divided": "the local projections viewed as NH (all) heads of D/W/NH dims: num_heads not divided by the world size",
    "reduce_avg": "the row-parallel output all-reduced then divided by the world size (averaged instead of summed)",
    "v_strided_slice": "v_proj sliced strided (weight[rank::world]) while q/k/o take the heads' contiguous block",
    "swapped_mappings": "the two region Functions swapped: reduce-from (all-reduce forward) before q/k/v, copy-to after o_proj",
    "o_bias_every_rank": "row-parallel o_proj adds its replicated bias on every rank before the all-reduce",
}


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(DIN, D)
        self.ln = nn.LayerNorm(D)
        self.q_proj, self.k_proj, self.v_proj = nn.Linear(D, D), nn.Linear(D, D), nn.Linear(D, D)
        self.o_proj = nn.Linear(D, D)
        self.head = nn.Linear(D, OUT)

    def attend(self, a: torch.Tensor, heads: int) -> torch.Tensor:
        b, t, _ = a.shape
        q, k, v = (F.linear(a, m.weight, m.bias).view(b, t, heads, -1).transpose(1, 2)
                   for m in (self.q_proj, self.k_proj, self.v_proj))
        att = (q @ k.transpose(-2, -1)) * q.size(-1) ** -0.5
        att = att.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
        return (att @ v).transpose(1, 2).reshape(b, t, -1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.inp(x))
        return self.head(h + self.o_proj(self.attend(self.ln(h), NH)))


class TPNet(Net):
    """The same names; q/k/v hold this rank's heads' rows, o_proj their columns."""

    def __init__(self, bug: str | None) -> None:
        super().__init__()
        r, w = rank(), world()
        self.bug = bug
        rows = slice(r * D // w, (r + 1) * D // w)
        for m in (self.q_proj, self.k_proj, self.v_proj):
            sl = slice(r, None, w) if bug == "v_strided_slice" and m is self.v_proj else rows
            m.weight = nn.Parameter(m.weight.detach()[sl].clone())
            m.bias = nn.Parameter(m.bias.detach()[sl].clone())
        self.o_proj.weight = nn.Parameter(self.o_proj.weight.detach()[:, rows].clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.inp(x))
        a = self.ln(h)
        a = reduce_from(a) if self.bug == "swapped_mappings" else copy_to(a)
        heads = NH if self.bug == "heads_not_divided" else NH // world()
        ctx = self.attend(a, heads)
        bias = self.bug == "o_bias_every_rank"
        o = F.linear(ctx, self.o_proj.weight, self.o_proj.bias if bias else None)
        o = copy_to(o) if self.bug == "swapped_mappings" else reduce_from(o)
        if self.bug == "reduce_avg":
            o = o / world()
        if not bias:
            o = o + self.o_proj.bias
        return self.head(h + o)


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = gen(600 + step)
    return torch.randn(B, T, DIN, generator=g), torch.randn(B, T, OUT, generator=g)


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: the same rows, its heads."""
    model = TPNet(bug)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    for step in range(STEPS):
        x, y = batch(step)
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()


def reference(world_size: int) -> None:
    """One device: every head."""
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    for step in range(STEPS):
        x, y = batch(step)
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()
