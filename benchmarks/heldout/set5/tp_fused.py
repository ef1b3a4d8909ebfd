"""Tensor-parallel nanoGPT attention with a FUSED qkv projection, by hand: the one-device model is
nanoGPT's ``CausalSelfAttention`` (``c_attn = nn.Linear(n_embd, 3 * n_embd)``, ``q, k, v =
self.c_attn(x).split(n_embd, dim=2)``, ``c_proj``), and each rank holds, as one column-parallel
``c_attn`` weight, ITS heads' rows of q, of k and of v stacked ``[q_r; k_r; v_r]`` (so that its local
``split(n_embd // W)`` gives its q, k, v), ``c_proj`` row-parallel (bias after the all-reduce). Each
rank slices the same full initialisation; every rank reads the same rows; SGD with momentum.

Follows karpathy/nanoGPT ``model.py`` (``CausalSelfAttention``) and NVIDIA/Megatron-LM
``megatron/core/transformer/attention.py`` / ``tensor_parallel/layers.py`` (a fused ``linear_qkv``
column-parallel over the heads; the region mappings of ``mappings.py``).

NEEDS the plugin's ``shards=`` keyword: rank r's ``c_attn.weight`` is not a contiguous block of the
one-device ``c_attn.weight`` (rows q_r, k_r, v_r come from three places), so no concatenation in rank
order rebuilds it. ``SHARDS`` below is what a user passes: ``dist.assert_same_training(..., shards=
SHARDS)``; the runner passes it when the plugin's ``assert_same_training`` has that keyword.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .common import copy_to, gen, rank, reduce_from, world

DIN, D, NH, OUT, B, T = 6, 8, 4, 3, 4, 5
LR, MOMENTUM = 0.1, 0.9
STEPS = 5
CORRECT = {"default": (2,)}
BUGS = {
    "contiguous_slice": "c_attn sliced as a contiguous row block of the fused [3D, D] weight (rank 0: all of q and no v)",
    "per_head_split": "the rank's [q_r; k_r; v_r] rows read back per head as (heads, 3, head_dim), Megatron's interleaved layout",
}


def unshard_qkv(pieces: list[torch.Tensor]) -> torch.Tensor:
    """The full fused tensor (weight or bias) from the ranks' pieces in rank order: every rank's q
    rows, then every rank's k rows, then every rank's v rows."""
    return torch.cat([torch.cat([p.chunk(3, 0)[i] for p in pieces]) for i in range(3)])


SHARDS = {"c_attn.weight": unshard_qkv, "c_attn.bias": unshard_qkv, "c_proj.weight": 1}


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(DIN, D)
        self.ln_1 = nn.LayerNorm(D)
        self.c_attn = nn.Linear(D, 3 * D)
        self.c_proj = nn.Linear(D, D)
        self.head = nn.Linear(D, OUT)

    def attend(self, qkv: torch.Tensor, width: int, heads: int, per_head: bool = False) -> torch.Tensor:
        b, t, _ = qkv.shape
        if per_head:
            q, k, v = qkv.view(b, t, heads, 3, -1).unbind(3)
            q, k, v = (z.transpose(1, 2) for z in (q, k, v))
        else:
            q, k, v = (z.view(b, t, heads, -1).transpose(1, 2) for z in qkv.split(width, dim=2))
        att = (q @ k.transpose(-2, -1)) * q.size(-1) ** -0.5
        att = att.masked_fill(torch.ones(t, t, dtype=torch.bool).triu(1), float("-inf")).softmax(-1)
        return (att @ v).transpose(1, 2).reshape(b, t, -1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.inp(x))
        return self.head(h + self.c_proj(self.attend(self.c_attn(self.ln_1(h)), D, NH)))


class TPNet(Net):
    def __init__(self, bug: str | None) -> None:
        super().__init__()
        r, w = rank(), world()
        self.bug = bug
        wt, bs = self.c_attn.weight.detach(), self.c_attn.bias.detach()
        if bug == "contiguous_slice":
            rows = torch.arange(r * 3 * D // w, (r + 1) * 3 * D // w)
        else:
            rows = torch.cat([torch.arange(i * D + r * D // w, i * D + (r + 1) * D // w) for i in range(3)])
        self.c_attn.weight = nn.Parameter(wt[rows].clone())
        self.c_attn.bias = nn.Parameter(bs[rows].clone())
        self.c_proj.weight = nn.Parameter(self.c_proj.weight.detach()[:, r * D // w:(r + 1) * D // w].clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = world()
        h = torch.tanh(self.inp(x))
        qkv = self.c_attn(copy_to(self.ln_1(h)))
        ctx = self.attend(qkv, D // w, NH // w, per_head=self.bug == "per_head_split")
        o = reduce_from(F.linear(ctx, self.c_proj.weight)) + self.c_proj.bias
        return self.head(h + o)


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = gen(650 + step)
    return torch.randn(B, T, DIN, generator=g), torch.randn(B, T, OUT, generator=g)


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: the same rows, its heads' q, k, v rows of the fused weight."""
    model = TPNet(bug)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    for step in range(STEPS):
        x, y = batch(step)
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()


def reference(world_size: int) -> None:
    """One device: nanoGPT's attention, fused c_attn whole."""
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    for step in range(STEPS):
        x, y = batch(step)
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()
