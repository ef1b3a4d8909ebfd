"""A timm Vision Transformer trained with Lightning Fabric under DDP, with gradient accumulation.

Follows the Lightning Fabric docs: "Convert PyTorch code to Fabric" (``fabric = Fabric(accelerator=...,
strategy="ddp", devices=...)``, ``fabric.launch()``, ``model, optimizer = fabric.setup(model,
optimizer)``, ``dataloader = fabric.setup_dataloaders(dataloader)``, ``fabric.backward(loss)``),
"Efficient Gradient Accumulation" (``is_accumulating = ...``; ``with fabric.no_backward_sync(model,
enabled=is_accumulating):`` around forward and ``fabric.backward(loss)``; ``optimizer.step()`` and
``optimizer.zero_grad()`` once the accumulation phase is over) and ``fabric.seed_everything``; the
model is built as timm's docs build one from a config (``timm.create_model("vit_tiny_patch16_224",
pretrained=False, num_classes=..., img_size=..., patch_size=..., embed_dim=..., depth=...,
num_heads=...)``). The group is already up, so Fabric finds the torchrun variables and joins it.
A step is one ``optimizer.step()``: four steps of ``ACCUM`` micro-batches each, which crosses an
epoch boundary (Fabric's loader calls ``set_epoch`` itself).
"""
from __future__ import annotations

import timm
import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from .common import images, torchrun_env

SEED, ROWS, SIZE, CLASSES, BATCH, LR = 1234, 48, 8, 4, 4, 0.1
STEPS = 4
CORRECT = {"default": (2, 4), "noaccum": (2,)}
BUGS = {
    "no_div_accum": "the micro-batch loss not divided by the accumulation steps: gradients x 2",
    "sync_never": "fabric.no_backward_sync(model, enabled=True) on every micro-batch: gradients never all-reduced",
    "seed_per_rank": "fabric.seed_everything(SEED + rank): each rank's DistributedSampler shuffles with its own seed",
    "no_dist_sampler": "setup_dataloaders(..., use_distributed_sampler=False): every rank reads the same rows",
    "zero_grad_every_micro": "optimizer.zero_grad() before every backward: the accumulated micro-batches dropped",
    "lr_scaled_world": "lr multiplied by fabric.world_size (linear scaling on top of the global batch)",
    "reduction_sum": "CrossEntropyLoss(reduction='sum') in the distributed loop: the loss summed over the rows",
}


def vit() -> nn.Module:
    return timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=CLASSES, img_size=SIZE,
                             patch_size=4, embed_dim=16, depth=2, num_heads=2, mlp_ratio=2.0)


def data() -> TensorDataset:
    return TensorDataset(*images(7, ROWS, SIZE, CLASSES))


def accum(variant: str | None) -> int:
    return 1 if variant == "noaccum" else 2


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: Fabric(strategy="ddp"), the docs' accumulation loop."""
    import lightning as L

    torchrun_env()
    fabric = L.Fabric(accelerator="cpu", strategy="ddp", devices=world_size)
    fabric.launch()
    fabric.seed_everything(SEED + fabric.global_rank if bug == "seed_per_rank" else SEED)
    model = vit()
    lr = LR * fabric.world_size if bug == "lr_scaled_world" else LR
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    model, optimizer = fabric.setup(model, optimizer)
    k = accum(variant)
    # without accumulation each rank takes the two micro-batches' rows at once (the same global batch)
    loader = DataLoader(data(), batch_size=BATCH * 2 // k, shuffle=True)
    loader = fabric.setup_dataloaders(loader, use_distributed_sampler=bug != "no_dist_sampler")
    criterion = nn.CrossEntropyLoss(reduction="sum" if bug == "reduction_sum" else "mean")
    steps, iteration = 0, 0
    model.train()
    while steps < STEPS:
        for x, y in loader:
            iteration += 1
            is_accumulating = iteration % k != 0
            if bug == "zero_grad_every_micro":
                optimizer.zero_grad()
            with fabric.no_backward_sync(model, enabled=is_accumulating or bug == "sync_never"):
                loss = criterion(model(x), y)
                fabric.backward(loss if bug == "no_div_accum" else loss / k)
            if not is_accumulating:
                optimizer.step()
                optimizer.zero_grad()
                steps += 1
                if steps == STEPS:
                    return


def reference(world_size: int) -> None:
    """One device: the global batch, the same sampler order with one replica, the same accumulation."""
    torch.manual_seed(SEED)
    model = vit()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    ds = data()
    sampler = DistributedSampler(ds, num_replicas=1, rank=0, shuffle=True, seed=SEED)
    loader = DataLoader(ds, batch_size=BATCH * world_size, sampler=sampler)
    criterion = nn.CrossEntropyLoss()
    k, steps, iteration, epoch = 2, 0, 0, 0
    model.train()
    while steps < STEPS:
        sampler.set_epoch(epoch)
        epoch += 1
        for x, y in loader:
            iteration += 1
            (criterion(model(x), y) / k).backward()
            if iteration % k == 0:
                optimizer.step()
                optimizer.zero_grad()
                steps += 1
                if steps == STEPS:
                    return
