"""A LightningModule trained by the Lightning ``Trainer`` under DDP on CPU, with gradient accumulation,
a per-step warm-up schedule and validation every few batches.

Follows the Lightning docs: "LightningModule" (``training_step`` returns the loss,
``validation_step``, ``configure_optimizers`` returning ``{"optimizer": ..., "lr_scheduler":
{"scheduler": ..., "interval": "step"}}``), "Trainer" flags (``Trainer(accelerator="cpu",
strategy="ddp", devices=N, max_steps=..., accumulate_grad_batches=..., val_check_interval=...)``;
the Trainer divides the loss by ``accumulate_grad_batches`` itself and skips the gradient sync while
accumulating), "Hardware agnostic training" (``use_distributed_sampler``: the Trainer puts a
``DistributedSampler`` in the loader and calls ``set_epoch``) and ``L.seed_everything``. The group
is already up, so the Trainer finds the torchrun variables and joins it (no processes launched).
A step is one ``optimizer.step()``: five steps of two micro-batches, across an epoch boundary.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from .common import gen, torchrun_env

SEED, ROWS, DIM, CLASSES, BATCH, LR = 4321, 64, 16, 4, 4, 0.2
STEPS = 5
WARMUP = 3
CORRECT = {"default": (2, 4), "noaccum": (2,)}
BUGS = {
    "double_div_accum": "training_step returns loss / accumulate_grad_batches (the Trainer divides again): gradients x 1/2",
    "sched_interval_epoch": "the warm-up scheduler returned without interval='step': stepped once per epoch",
    "no_dist_sampler": "Trainer(use_distributed_sampler=False) with a shuffling loader: every rank the same rows",
    "lr_scaled_world": "configure_optimizers multiplies the lr by trainer.world_size",
    "seed_per_rank": "L.seed_everything(SEED + rank): each rank's DistributedSampler shuffles with its own seed",
    "global_batch_per_rank": "the DataLoader given the global batch size on every rank: each step trains W x the rows",
}


def rows() -> TensorDataset:
    g = gen(3)
    x = torch.randn(ROWS, DIM, generator=g)
    return TensorDataset(x, (x[:, :CLASSES] + 0.5 * torch.randn(ROWS, CLASSES, generator=g)).argmax(1))


def warmup(step: int) -> float:
    return min(1.0, (step + 1) / WARMUP)


def make_module(lr_factor: float = 1.0, div: int = 1, interval: str | None = "step"):
    import lightning as L

    class Classifier(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = nn.Sequential(nn.Linear(DIM, 32), nn.LayerNorm(32), nn.GELU(), nn.Linear(32, CLASSES))

        def training_step(self, batch, batch_idx):
            x, y = batch
            return nn.functional.cross_entropy(self.net(x), y) / div

        def validation_step(self, batch, batch_idx):
            x, y = batch
            self.log("val_loss", nn.functional.cross_entropy(self.net(x), y), sync_dist=True)

        def configure_optimizers(self):
            lr = LR * (self.trainer.world_size if lr_factor != 1.0 else 1)
            optimizer = torch.optim.SGD(self.parameters(), lr=lr, momentum=0.9)
            scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup)
            config = {"scheduler": scheduler}
            if interval:
                config["interval"] = interval
            return {"optimizer": optimizer, "lr_scheduler": config}

    return Classifier()


def accum(variant: str | None) -> int:
    return 1 if variant == "noaccum" else 2


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: Trainer(strategy="ddp").fit(module, train loader, val loader)."""
    import lightning as L

    torchrun_env()
    L.seed_everything(SEED + int(torch.distributed.get_rank()) if bug == "seed_per_rank" else SEED, verbose=False)
    k = accum(variant)
    module = make_module(lr_factor=2.0 if bug == "lr_scaled_world" else 1.0,
                         div=k if bug == "double_div_accum" else 1,
                         interval=None if bug == "sched_interval_epoch" else "step")
    batch = BATCH * 2 // k * (world_size if bug == "global_batch_per_rank" else 1)
    train_loader = DataLoader(rows(), batch_size=batch, shuffle=True)
    val_loader = DataLoader(rows(), batch_size=batch)
    trainer = L.Trainer(accelerator="cpu", strategy="ddp", devices=world_size, max_steps=STEPS, max_epochs=100,
                        accumulate_grad_batches=k, val_check_interval=4, num_sanity_val_steps=0,
                        limit_val_batches=2, use_distributed_sampler=bug != "no_dist_sampler",
                        logger=False, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, deterministic=True)
    trainer.fit(module, train_loader, val_loader)


def reference(world_size: int) -> None:
    """One device: the same module and optimizer in a plain loop, the global batch, the same order,
    the same accumulation, the scheduler stepped after each optimizer step."""
    torch.manual_seed(SEED)
    module = make_module()
    optimizer = torch.optim.SGD(module.parameters(), lr=LR, momentum=0.9)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, warmup)
    ds = rows()
    sampler = DistributedSampler(ds, num_replicas=1, rank=0, shuffle=True, seed=SEED)
    loader = DataLoader(ds, batch_size=BATCH * world_size, sampler=sampler)
    steps, epoch = 0, 0
    while steps < STEPS:
        sampler.set_epoch(epoch)
        epoch += 1
        for i, batch in enumerate(loader):
            (module.training_step(batch, i) / 2).backward()
            if i % 2 == 1:
                optimizer.step()
                optimizer.zero_grad()
                scheduler.step()
                steps += 1
                if steps == STEPS:
                    return
