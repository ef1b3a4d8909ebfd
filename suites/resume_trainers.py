"""Trainers that checkpoint and resume, written as their public authors write them (small sizes,
synthetic data), each with the resume bugs users make, switched on by ``bug=``:

- ``ddp_snapshot``: pytorch/examples' DDP tutorial series (multigpu_torchrun.py): a ``Trainer`` that
  loads ``snapshot.pt`` if it exists (model state + EPOCHS_RUN), DistributedSampler with
  ``set_epoch(epoch)``, saves at the end of every ``save_every`` epochs from rank 0. ``ddp_snapshot_spawn``
  is the same as an mp.spawn entry (multigpu.py), with its own ``init_process_group``.
- ``gpt_train``: minGPT-like: AdamW with weight decay, a warm-up + cosine ``LambdaLR``, dropout,
  ``clip_grad_norm_``, a checkpoint every ``save_every`` iterations with the model, optimizer,
  scheduler, iteration and every rank's random state, in ``checkpoint_dir()``.
- ``fsdp2_dcp``: FSDP2 (fully_shard per block + root) with the DCP checkpointer of pytorch/examples'
  FSDP2 example (get/set_model_state_dict, get/set_optimizer_state_dict, dcp.save/load), which
  reshards on load; the global batch is fixed, so it trains alike at any world size.
"""
from __future__ import annotations

import math
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

import pytest_mgpu


def lm_rows(step, batch=8, seq=8, vocab=8):
    """Step ``step``'s global batch of token rows (inputs, next tokens): the same at any world size."""
    g = torch.Generator().manual_seed(1000 + step)
    data = torch.randint(0, vocab, (batch, seq + 1), generator=g)
    return data[:, :-1], data[:, 1:]


# ---- DDP tutorial: snapshot.pt, EPOCHS_RUN, DistributedSampler ---------------------------------------
def regression_data(n=64):
    g = torch.Generator().manual_seed(7)
    x = torch.randn(n, 10, generator=g)
    return TensorDataset(x, x @ torch.randn(10, 1, generator=g) + 0.1 * torch.randn(n, 1, generator=g))


class Trainer:
    def __init__(self, model, train_data, optimizer, save_every, snapshot_path, bug=None):
        self.gpu_id = dist.get_rank()
        self.model, self.train_data, self.optimizer = model, train_data, optimizer
        self.save_every, self.epochs_run, self.bug = save_every, 0, bug
        self.snapshot_path = snapshot_path
        load_from = "checkpoint.pt" if bug == "not_found" else snapshot_path
        if os.path.exists(load_from):
            self._load_snapshot(load_from)
        self.model = DDP(self.model)

    def _load_snapshot(self, path):
        snapshot = torch.load(path)
        self.model.load_state_dict(snapshot["MODEL_STATE"])
        if self.bug != "no_optimizer":
            self.optimizer.load_state_dict(snapshot["OPTIMIZER_STATE"])
        self.epochs_run = snapshot["EPOCHS_RUN"] + {"epoch_early": -1, "epoch_late": 1}.get(self.bug, 0)

    def _run_epoch(self, epoch):
        self.train_data.sampler.set_epoch(epoch - self.epochs_run if self.bug == "sampler_epoch" else epoch)
        for source, targets in self.train_data:
            self.optimizer.zero_grad()
            loss = F.mse_loss(self.model(source), targets)
            loss.backward()
            self.optimizer.step()

    def _save_snapshot(self, epoch):
        snapshot = {"MODEL_STATE": self.model.module.state_dict(), "EPOCHS_RUN": epoch + 1,
                    "OPTIMIZER_STATE": self.optimizer.state_dict()}
        if self.gpu_id == 0:
            torch.save(snapshot, self.snapshot_path)
        dist.barrier()

    def train(self, max_epochs):
        for epoch in range(self.epochs_run, max_epochs):
            self._run_epoch(epoch)
            if epoch % self.save_every == 0:
                self._save_snapshot(epoch)


def ddp_snapshot(max_epochs=3, bug=None, batch_size=4, hidden=16, lr=0.05):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(10, hidden), nn.ReLU(), nn.Linear(hidden, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    data = regression_data()
    loader = DataLoader(data, batch_size=batch_size, shuffle=False, sampler=DistributedSampler(data))
    Trainer(model, loader, optimizer, 1, "snapshot.pt", bug).train(max_epochs)


def ddp_snapshot_spawn(rank, world_size, max_epochs=3, bug=None):
    """multigpu.py: an mp.spawn entry that sets up its own group on a hard-coded port."""
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "localhost", "12355"
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    ddp_snapshot(max_epochs, bug)
    dist.destroy_process_group()


# ---- minGPT-like: AdamW, warm-up + cosine LambdaLR, dropout, a checkpoint every few iterations -------
class TinyGPT(nn.Module):
    def __init__(self, vocab=8, dim=16, seq=8, dropout=0.1):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Parameter(torch.zeros(seq, dim))
        self.drop = nn.Dropout(dropout)
        self.ln, self.mlp = nn.LayerNorm(dim), nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))
        self.head = nn.Linear(dim, vocab)

    def forward(self, idx):
        x = self.drop(self.tok(idx) + self.pos[: idx.shape[1]])
        return self.head(self.ln(x + self.mlp(x)))


def _schedule(warmup, total):
    def lr_lambda(it):
        if it < warmup:
            return (it + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (it - warmup) / max(1, total - warmup)))
    return lr_lambda


def gpt_train(max_iters=12, save_every=4, bug=None, global_batch=8, dim=16):
    rank, world = dist.get_rank(), dist.get_world_size()
    folder = pytest_mgpu.checkpoint_dir()
    torch.manual_seed(0)
    model = TinyGPT(dim=dim)
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    rest = [p for n, p in model.named_parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
                                  lr=3e-3, betas=(0.9, 0.95))
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, _schedule(3, max_iters))
    model = DDP(model)
    iter_num = 0
    path = os.path.join(folder, "ckpt.pt")
    if os.path.exists(path):
        ckpt = torch.load(path, weights_only=False)
        model.module.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        if bug != "no_scheduler":
            scheduler.load_state_dict(ckpt["scheduler"])
        iter_num = ckpt["iter_num"] + (1 if bug == "step_late" else 0)
        if bug != "no_rng":
            torch.set_rng_state(torch.load(os.path.join(folder, f"rng_{rank}.pt")))
    while iter_num < max_iters:
        x, y = lm_rows(iter_num, batch=global_batch)
        share = global_batch // world
        x, y = x[rank * share:(rank + 1) * share], y[rank * share:(rank + 1) * share]
        loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        if bug == "saved_before_step" and (iter_num + 1) % save_every == 0:
            _gpt_save(path, model, optimizer, scheduler, iter_num + 1, rank, folder)
        optimizer.step()
        scheduler.step()
        iter_num += 1
        if bug != "saved_before_step" and iter_num % save_every == 0:
            _gpt_save(path, model, optimizer, scheduler, iter_num, rank, folder)


def _gpt_save(path, model, optimizer, scheduler, iter_num, rank, folder):
    torch.save(torch.get_rng_state(), os.path.join(folder, f"rng_{rank}.pt"))
    if rank == 0:
        torch.save({"model": model.module.state_dict(), "optimizer": optimizer.state_dict(),
                    "scheduler": scheduler.state_dict(), "iter_num": iter_num}, path)
    dist.barrier()


# ---- FSDP2 + DCP (the FSDP2 example's checkpointer), resharding on load ------------------------------
GLOBAL_BATCH = 8


class Block(nn.Module):
    def __init__(self, dim):
        super().__init__()
        self.norm, self.ff = nn.LayerNorm(dim), nn.Sequential(nn.Linear(dim, 2 * dim), nn.GELU(), nn.Linear(2 * dim, dim))

    def forward(self, x):
        return x + self.ff(self.norm(x))


class Transformer(nn.Module):
    """The FSDP2 example's shape, small: embeddings, blocks (each fully_shard-ed), a norm and a head."""

    def __init__(self, vocab=8, dim=16, seq=8, n_layers=2):
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, dim), nn.Embedding(seq, dim)
        self.layers = nn.ModuleList(Block(dim) for _ in range(n_layers))
        self.norm, self.output = nn.LayerNorm(dim), nn.Linear(dim, vocab, bias=False)

    def forward(self, idx):
        h = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        for layer in self.layers:
            h = layer(h)
        return self.output(self.norm(h))


def fsdp2_dcp(steps=6, save_every=2, bug=None, dim=16):
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import (get_model_state_dict, get_optimizer_state_dict,
                                                         set_model_state_dict, set_optimizer_state_dict)
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = Transformer(dim=dim)
    mesh = init_device_mesh("cpu", (world,))
    for layer in model.layers:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optim = torch.optim.AdamW(model.parameters(), lr=1e-2)
    folder, start = str(pytest_mgpu.checkpoint_dir()), 0
    if os.path.exists(os.path.join(folder, "step.pt")):
        start = torch.load(os.path.join(folder, "step.pt"))["step"]
        if bug == "local_shards":
            saved = torch.load(os.path.join(folder, f"shard_{rank}.pt"))
            with torch.no_grad():
                for name, p in model.named_parameters():
                    p.to_local().copy_(saved[name])
        else:
            state = {"model": get_model_state_dict(model)}
            if bug != "no_optimizer":
                state["optim"] = get_optimizer_state_dict(model, optim)
            dcp.load(state, checkpoint_id=os.path.join(folder, "dcp"))
            set_model_state_dict(model, state["model"])
            if bug != "no_optimizer":
                set_optimizer_state_dict(model, optim, state["optim"])
    for step in range(start, steps):
        x, y = lm_rows(step, batch=GLOBAL_BATCH)
        share = GLOBAL_BATCH // world
        loss = F.cross_entropy(model(x[rank * share:(rank + 1) * share]).flatten(0, 1),
                               y[rank * share:(rank + 1) * share].flatten())
        loss.backward()
        optim.step()
        optim.zero_grad()
        if (step + 1) % save_every == 0:
            if bug == "local_shards":
                torch.save({n: p.to_local().detach().clone() for n, p in model.named_parameters()},
                           os.path.join(folder, f"shard_{rank}.pt"))
            else:
                dcp.save({"model": get_model_state_dict(model), "optim": get_optimizer_state_dict(model, optim)},
                         checkpoint_id=os.path.join(folder, "dcp"))
            if rank == 0:
                torch.save({"step": step + 1}, os.path.join(folder, "step.pt"))
            dist.barrier()
