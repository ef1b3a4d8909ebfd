"""Megatron-style tensor-parallel MLP written by hand: a ``ColumnParallelLinear`` fc1 (each rank the
block of output rows, bias sliced alike) and a ``RowParallelLinear`` fc2 (each rank the block of input
columns; the bias replicated and added once, after the all-reduce), as plain ``nn.Parameter``s holding
each rank's slice of the full initialisation; LayerNorm before, a residual around, on top of an input
projection and under a head (both replicated). SGD with momentum on every rank.

Follows NVIDIA/Megatron-LM ``megatron/core/tensor_parallel/layers.py`` (``ColumnParallelLinear``:
``input_parallel = copy_to_tensor_model_parallel_region(input_)``, ``F.linear(input_parallel,
weight, bias)``; ``RowParallelLinear``: ``output_ = reduce_from_tensor_model_parallel_region(
output_parallel)``, ``output = output_ + self.bias``; ``_initialize_affine_weight_cpu``: the master
weight initialised whole and each rank keeping its ``torch.split`` block), ``mappings.py`` (the four
region functions) and, for the ``sp`` variant, sequence parallelism (``gather_from_sequence_parallel_
region`` before fc1, ``reduce_scatter_to_sequence_parallel_region`` after fc2, and
``megatron/core/distributed/finalize_model_grads.py``: the gradients of parameters that see only the
rank's tokens - LayerNorm - all-reduced over the tensor-parallel group). Every rank reads the same
global rows (``sp``: its block of the tokens). Variants: plain TP (default, 2 and 4 ranks), ``sp``.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .common import all_reduce_grads, copy_to, gather_seq, gen, rank, reduce_from, reduce_scatter_seq, world

DIN, D, H, OUT, TOKENS = 6, 8, 16, 3, 16
LR, MOMENTUM = 0.1, 0.9
STEPS = 5
CORRECT = {"default": (2, 4), "sp": (2,)}
BUGS = {
    "wrong_slice": "fc1 (column-parallel) sliced strided, weight[rank::world], while fc2's columns are the contiguous block",
    "copy_no_bwd_allreduce": "the copy-to-region Function's backward returns the gradient without the all-reduce",
    "allreduce_both": "the reduce-from-region Function all-reduces in the backward too",
    "row_bias_every_rank": "row-parallel fc2 adds its (replicated) bias on every rank before the all-reduce",
    "local_init": "each rank initialises its own shard as a fresh nn.Linear(D, H // world) instead of slicing the full init",
    "dp_allreduce_all": "every gradient averaged over the group as DDP would, the sharded fc1/fc2 slices included",
    "sp_ln_not_reduced": "sequence parallel: the LayerNorm's gradients not all-reduced over the group (only its token block's)",
    "sp_loss_not_scaled": "sequence parallel: each rank's loss the mean over its tokens, not divided by the world size",
}


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(DIN, D)
        self.ln = nn.LayerNorm(D)
        self.fc1 = nn.Linear(D, H)
        self.fc2 = nn.Linear(H, D)
        self.head = nn.Linear(D, OUT)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.inp(x))
        h = h + self.fc2(F.gelu(self.fc1(self.ln(h))))
        return self.head(h)


class TPNet(Net):
    """The same module names; fc1/fc2 hold this rank's slices."""

    def __init__(self, bug: str | None, sp: bool) -> None:
        super().__init__()
        r, w = rank(), world()
        self.bug, self.sp = bug, sp
        if bug == "local_init":
            self.fc1 = nn.Linear(D, H // w)
            self.fc2 = nn.Linear(H // w, D)
        else:
            rows = slice(r, None, w) if bug == "wrong_slice" else slice(r * H // w, (r + 1) * H // w)
            self.fc1.weight = nn.Parameter(self.fc1.weight.detach()[rows].clone())
            self.fc1.bias = nn.Parameter(self.fc1.bias.detach()[rows].clone())
            cols = slice(r * H // w, (r + 1) * H // w)
            self.fc2.weight = nn.Parameter(self.fc2.weight.detach()[:, cols].clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.inp(x))
        a = self.ln(h)
        a = gather_seq(a) if self.sp else copy_to(a, reduce_bwd=self.bug != "copy_no_bwd_allreduce")
        z = F.gelu(F.linear(a, self.fc1.weight, self.fc1.bias))
        if self.bug == "row_bias_every_rank":
            o = F.linear(z, self.fc2.weight, self.fc2.bias)
            o = reduce_scatter_seq(o) if self.sp else reduce_from(o)
        else:
            o = F.linear(z, self.fc2.weight)
            o = reduce_scatter_seq(o) if self.sp else reduce_from(o, reduce_bwd=self.bug == "allreduce_both")
            o = o + self.fc2.bias
        return self.head(h + o)


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = gen(500 + step)
    return torch.randn(TOKENS, DIN, generator=g), torch.randn(TOKENS, OUT, generator=g)


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: the same rows (``sp``: its token block), its fc1/fc2 slices, SGD."""
    sp = variant == "sp" or (bug or "").startswith("sp_")
    r = rank()
    model = TPNet(bug, sp)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    sharded = {"fc1.weight", "fc1.bias", "fc2.weight"}
    for step in range(STEPS):
        x, y = batch(step)
        if sp:
            x, y = x.chunk(world_size)[r], y.chunk(world_size)[r]
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        if sp and bug != "sp_loss_not_scaled":
            loss = loss / world_size   # the global mean is the mean of the ranks' means
        loss.backward()
        if sp:   # replicated parameters that saw only this rank's tokens
            skip = {"ln.weight", "ln.bias"} if bug == "sp_ln_not_reduced" else set()
            all_reduce_grads([p for n, p in model.named_parameters() if n not in sharded | skip])
        if bug == "dp_allreduce_all":
            all_reduce_grads(model.parameters(), divide=world_size)
        opt.step()


def reference(world_size: int) -> None:
    """One device: the unsharded block on the same rows."""
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    for step in range(STEPS):
        x, y = batch(step)
        opt.zero_grad()
        F.mse_loss(model(x), y).backward()
        opt.step()
