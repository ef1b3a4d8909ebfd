"""FSDP2 (``fully_shard`` on a CPU mesh) with gradient accumulation through
``set_requires_gradient_sync``.

Follows pytorch/examples ``distributed/FSDP2/example.py`` (``fully_shard`` on each layer, then on the
root, over ``init_device_mesh``) and torchtitan's training step (the global batch split into
micro-batches, each micro-batch's loss divided by the number of micro-batches, gradients reduced only
on the last backward: ``model.set_requires_gradient_sync(is_last)``).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from .common import block, classify_rows, rank, reseed_apart

DIM, HIDDEN, CLASSES = 16, 32, 4
MICRO_ROWS, MICROS, LR = 8, 2, 1e-2  # global rows per micro-batch, micro-batches per step
STEPS = 4
CORRECT = {"default": (2, 4), "strided": (2,)}
BUGS = {
    "loss_not_divided": "each micro-batch's loss is not divided by the number of micro-batches",
    "sync_inverted": "set_requires_gradient_sync(micro == 0): only the first micro-batch is reduced in time",
    "same_rows": "every rank takes the first local-batch rows of the global batch (no sharding by rank)",
    "lr_scaled": "lr multiplied by the world size (linear scaling rule) while the global batch is unchanged",
    "seed_apart": "torch.manual_seed(seed + rank) before building the model: fully_shard keeps each rank's init",
}


def model() -> nn.Sequential:
    """A 3-layer MLP classifier."""
    return nn.Sequential(nn.Linear(DIM, HIDDEN), nn.GELU(), nn.Linear(HIDDEN, HIDDEN), nn.GELU(),
                         nn.Linear(HIDDEN, CLASSES))


def micro_batch(step: int, micro: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global rows of one micro-batch."""
    return classify_rows(1000 + 10 * step + micro, MICRO_ROWS, DIM, CLASSES)


def _local(x: torch.Tensor, w: int, bug: str | None, variant: str | None) -> torch.Tensor:
    """This rank's rows of a global micro-batch."""
    if bug == "same_rows":
        return x[: len(x) // w]
    if variant == "strided":
        return x[rank()::w]
    return block(x, rank(), w)


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: fully_shard per Linear and the root, AdamW, MICROS micro-batches per step."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    if bug == "seed_apart":
        reseed_apart()
    net = model()
    mesh = init_device_mesh("cpu", (world_size,))
    for layer in net:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(net, mesh=mesh)
    opt = torch.optim.AdamW(net.parameters(), lr=LR * world_size if bug == "lr_scaled" else LR)
    for step in range(STEPS):
        opt.zero_grad()
        for micro in range(MICROS):
            net.set_requires_gradient_sync(micro == 0 if bug == "sync_inverted" else micro == MICROS - 1)
            x, y = (_local(t, world_size, bug, variant) for t in micro_batch(step, micro))
            loss = F.cross_entropy(net(x), y)
            (loss if bug == "loss_not_divided" else loss / MICROS).backward()
        opt.step()


def reference(world_size: int) -> None:
    """One device: the same micro-batches, whole, each loss divided by MICROS."""
    net = model()
    opt = torch.optim.AdamW(net.parameters(), lr=LR)
    for step in range(STEPS):
        opt.zero_grad()
        for micro in range(MICROS):
            x, y = micro_batch(step, micro)
            (F.cross_entropy(net(x), y) / MICROS).backward()
        opt.step()
