"""An MLP regressor trained with Hugging Face accelerate: gradient accumulation through
``accelerator.accumulate``, ``split_batches=True``, and a ReduceLROnPlateau schedule fed the
processes' mean loss.

Follows the accelerate docs: "Quicktour" / "Add Accelerate to your code" (``accelerator =
Accelerator()``, ``model, optimizer, dataloader, scheduler = accelerator.prepare(...)``,
``accelerator.backward(loss)``), "Gradient accumulation" (``Accelerator(gradient_accumulation_steps=2)``;
``with accelerator.accumulate(model):`` around forward, ``accelerator.backward(loss)``,
``optimizer.step()``, ``scheduler.step()``, ``optimizer.zero_grad()`` called every batch: accelerate
divides the loss and skips the step and the sync while accumulating), "Comparing performance between
different device setups" (``DataLoaderConfiguration(split_batches=True)``: the loader's batch size is
the global batch, split among the processes, and a prepared scheduler steps once per optimizer step)
and ``accelerator.gather`` for a metric every process must agree on (the plateau scheduler's loss);
``accelerate.utils.set_seed``. The test-suite pattern of accelerate's own tests resets the
process-wide state between runs in one process. A step is one ``optimizer.step()``: six steps of
two micro-batches, across an epoch boundary.
"""
from __future__ import annotations

import contextlib

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from .common import gen, torchrun_env

SEED, ROWS, DIM, OUT, BATCH, LR = 99, 64, 16, 2, 8, 0.1
STEPS = 6
CORRECT = {"default": (2, 4), "noaccum": (2,)}
BUGS = {
    "manual_div_accum": "loss / gradient_accumulation_steps before accelerator.backward (which divides again): gradients x 1/2",
    "plateau_local_loss": "ReduceLROnPlateau stepped with the rank's own loss instead of the gathered mean",
    "sched_not_prepared": "the scheduler left out of prepare() and stepped every micro-batch: its patience counts micro-batches",
    "no_accumulate_ctx": "the accelerator.accumulate(model) context left out: the optimizer steps every micro-batch",
    "lr_scaled_world": "lr multiplied by accelerator.num_processes although split_batches keeps the global batch",
    "no_split_batches": "Accelerator() without split_batches=True: each process takes the whole loader batch (global batch x W)",
}


def regressor() -> nn.Module:
    return nn.Sequential(nn.Linear(DIM, 32), nn.LayerNorm(32), nn.Tanh(), nn.Linear(32, OUT))


def rows() -> TensorDataset:
    g = gen(5)
    x = torch.randn(ROWS, DIM, generator=g)
    return TensorDataset(x, torch.sin(x[:, :OUT] * 2) + 0.3 * torch.randn(ROWS, OUT, generator=g))


def plateau(optimizer):
    return torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, mode="min", factor=0.5, patience=0, threshold=0.05)


def accum(variant: str | None) -> int:
    return 1 if variant == "noaccum" else 2


def train(world_size: int, bug: str | None = None, variant: str | None = None) -> None:
    """Every rank: the accelerate docs' accumulation loop."""
    from accelerate import Accelerator, DataLoaderConfiguration
    from accelerate.state import AcceleratorState, GradientState
    from accelerate.utils import set_seed

    torchrun_env()
    AcceleratorState._reset_state(reset_partial_state=True)
    GradientState._reset_state()
    k = accum(variant)
    accelerator = Accelerator(gradient_accumulation_steps=k, cpu=True,
                              dataloader_config=DataLoaderConfiguration(split_batches=bug != "no_split_batches"))
    set_seed(SEED)
    model = regressor()
    lr = LR * accelerator.num_processes if bug == "lr_scaled_world" else LR
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    scheduler = plateau(optimizer)
    loader = DataLoader(rows(), batch_size=BATCH * 2 // k, shuffle=True, generator=gen(SEED))
    if bug == "sched_not_prepared":
        model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    else:
        model, optimizer, loader, scheduler = accelerator.prepare(model, optimizer, loader, scheduler)
    steps, window = 0, []
    model.train()
    while steps < STEPS:
        for x, y in loader:
            if bug == "no_accumulate_ctx":
                ctx = contextlib.nullcontext()
            else:
                ctx = accelerator.accumulate(model)
            with ctx:
                loss = nn.functional.mse_loss(model(x), y)
                accelerator.backward(loss / k if bug == "manual_div_accum" else loss)
                window.append(loss.detach())
                optimizer.step()
                if bug == "sched_not_prepared":
                    scheduler.step(accelerator.gather(loss.detach()).mean())
                optimizer.zero_grad()
            if accelerator.sync_gradients or bug == "no_accumulate_ctx":
                local = torch.stack(window).mean()
                window = []
                if bug == "plateau_local_loss":
                    scheduler.step(local)
                elif bug != "sched_not_prepared":
                    scheduler.step(accelerator.gather(local).mean())
                steps += 1
                if steps == STEPS:
                    return


def reference(world_size: int) -> None:
    """One device: the global batch from the same shuffled order, the same accumulation, the plateau
    scheduler fed the step's mean loss."""
    torch.manual_seed(SEED)
    model = regressor()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    scheduler = plateau(optimizer)
    loader = DataLoader(rows(), batch_size=BATCH, shuffle=True, generator=gen(SEED))
    steps, window = 0, []
    while steps < STEPS:
        for i, (x, y) in enumerate(loader):
            loss = nn.functional.mse_loss(model(x), y)
            (loss / 2).backward()
            window.append(loss.detach())
            if i % 2 == 1:
                optimizer.step()
                optimizer.zero_grad()
                scheduler.step(torch.stack(window).mean())
                window = []
                steps += 1
                if steps == STEPS:
                    return
