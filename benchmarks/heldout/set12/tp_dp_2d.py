"""2-D parallel by hand: Megatron tensor parallelism inside data-parallel groups. Process groups made with
``dist.new_group`` as Megatron's ``initialize_model_parallel`` lays them out (TP groups of consecutive
ranks ``[0, 1], [2, 3]``; DP groups ``[0, 2], [1, 3]``). The model: a replicated input layer, a Megatron
MLP (``fc1`` column-parallel: this TP rank's block of the hidden units, entered through ``copy_to``
(identity forward, all-reduce of the input gradient over the TP group); ``fc2`` row-parallel: this TP
rank's block of the input columns, its partial outputs summed over the TP group by ``reduce_from``, the
bias added after the sum), a replicated head. Every rank of a TP group reads the same rows: its DP
group's block of the global batch. After the backward every gradient (sharded and replicated) is
averaged over the DP group only (all-reduce, divide by the DP size). SGD with momentum. Every rank
slices the same full initialisation.

At 2 ranks the grid is TP 2 x DP 1; at 4 ranks TP 2 x DP 2. The bugs run at 4 ranks (``BUG_WORLD``).
``SHARDS`` puts ``fc1`` / ``fc2`` back together from the first TP group's ranks (the other TP groups
hold replicas of the same shards).

The one-device reference: the unsharded model on the global batch.

Follows NVIDIA/Megatron-LM ``megatron/core/parallel_state.py`` (``initialize_model_parallel``: TP
groups ``range(i * tp, (i + 1) * tp)``, DP groups strided by ``tp``; every rank builds every group),
``megatron/core/tensor_parallel/layers.py`` (``ColumnParallelLinear``, ``RowParallelLinear`` with
``skip_bias_add`` / the bias added after the reduction), ``megatron/core/tensor_parallel/mappings.py``
(``copy_to_tensor_model_parallel_region``, ``reduce_from_tensor_model_parallel_region``) and
``megatron/core/distributed/`` (gradients all-reduced over ``get_data_parallel_group()`` and scaled by
``1 / data_parallel_world_size``).
"""
from __future__ import annotations

import torch
import torch.distributed as tdist
import torch.nn.functional as F
from torch import nn

from .common import copy_to, gen, grid, reduce_from

DIN, D, H, C, GB, SEED, TP = 5, 8, 16, 3, 8, 61, 2
LR = 0.1
STEPS = 5
CORRECT = {"default": (2, 4)}
BUG_WORLD = 4
BUGS = {
    "dp_allreduce_world": "the gradients are averaged over the whole world instead of the DP group: TP ranks' different shards are mixed",
    "dp_allreduce_missing": "the DP all-reduce of the gradients is left out: each DP replica steps with its own rows' gradient",
    "dp_sum_not_avg": "the DP all-reduce sums the gradients without dividing by the DP size",
    "row_out_not_reduced": "the row-parallel fc2's partial outputs are not all-reduced over the TP group",
    "copy_bwd_no_reduce": "copy_to's backward does not all-reduce the input gradient over the TP group: the input layer gets a partial gradient",
    "bias_before_reduce": "the row-parallel bias is added on every TP rank before the all-reduce, so it is counted TP times",
    "rows_by_global_rank": "the data is split by global rank (4 blocks) instead of by DP rank: the ranks of a TP group read different rows",
}


def _cat0(pieces):
    return torch.cat(pieces[:TP], 0)


def _cat1(pieces):
    return torch.cat(pieces[:TP], 1)


SHARDS = {"fc1.weight": _cat0, "fc1.bias": _cat0, "fc2.weight": _cat1}


class Net(nn.Module):
    """The MLP; ``tp``/``tp_rank`` pick this rank's shard of the one-device initialisation."""

    def __init__(self, tp: int = 1, tp_rank: int = 0, group=None, bug=None) -> None:
        super().__init__()
        torch.manual_seed(SEED)
        full1, full2 = nn.Linear(D, H), nn.Linear(H, D)
        self.inp, self.head = nn.Linear(DIN, D), nn.Linear(D, C)
        blk = slice(tp_rank * H // tp, (tp_rank + 1) * H // tp)
        self.fc1 = nn.Linear(D, H // tp)
        self.fc2 = nn.Linear(H // tp, D)
        with torch.no_grad():
            self.fc1.weight.copy_(full1.weight[blk])
            self.fc1.bias.copy_(full1.bias[blk])
            self.fc2.weight.copy_(full2.weight[:, blk])
            self.fc2.bias.copy_(full2.bias)
        self.group, self.bug, self.tp = group, bug, tp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.tanh(self.inp(x))
        a = F.gelu(self.fc1(copy_to(h, self.group, reduce_bwd=self.bug != "copy_bwd_no_reduce")))
        if self.bug == "bias_before_reduce":
            o = F.linear(a, self.fc2.weight, self.fc2.bias)
        else:
            o = F.linear(a, self.fc2.weight)
        if self.bug != "row_out_not_reduced":
            o = reduce_from(o, self.group)
        if self.bug != "bias_before_reduce":
            o = o + self.fc2.bias
        return self.head(h + o)


def data(step: int):
    g = gen(SEED + step)
    x = torch.randn(GB, DIN, generator=g)
    y = (x[:, :C] + 0.4 * torch.randn(GB, C, generator=g)).argmax(1)
    return x, y


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: its TP shard, its DP group's rows, gradients averaged over the DP group."""
    gr = grid(TP)
    model = Net(gr.tp, gr.tp_rank, gr.tp_group, bug)
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    if bug == "rows_by_global_rank":
        lb, who = GB // world_size, tdist.get_rank()
    else:
        lb, who = GB // gr.dp, gr.dp_rank
    for step in range(STEPS):
        x, y = data(step)
        loss = F.cross_entropy(model(x[who * lb:(who + 1) * lb]), y[who * lb:(who + 1) * lb])
        opt.zero_grad()
        loss.backward()
        for p in model.parameters():
            if bug == "dp_allreduce_missing":
                break
            if bug == "dp_allreduce_world":
                tdist.all_reduce(p.grad)
                p.grad.div_(world_size)
            else:
                tdist.all_reduce(p.grad, group=gr.dp_group)
                if bug != "dp_sum_not_avg":
                    p.grad.div_(gr.dp)
        opt.step()


def reference(world_size: int) -> None:
    """One device: the unsharded model on the global batch."""
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    for step in range(STEPS):
        x, y = data(step)
        loss = F.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
