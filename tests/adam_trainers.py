"""A small causal LM trained as a new user trains one: DDP, a DistributedSampler, AdamW, warm-up +
cosine ``LambdaLR``, ``clip_grad_norm_(1.0)``; resumable from a checkpoint every 4 steps; and a
gradient-accumulation loop. Each has the flags of the bugs the power tests inject: the ranks' learning
rate x (1 + eps) from a step, the scheduler not restored, the resumed run's learning rate x (1 + eps),
the micro-batches' loss not divided.

The attention layer (``nn.MultiheadAttention``) has a key bias whose exact gradient is zero: AdamW
turns its roundoff into full-size steps of random sign, the chaos the line must not spread."""
import math
import os

import torch
import torch.distributed as tdist
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

V, D, T = 64, 32, 16


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(D), nn.LayerNorm(D)
        self.attn = nn.MultiheadAttention(D, 4, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(D, 4 * D), nn.GELU(), nn.Linear(4 * D, D))

    def forward(self, x):
        mask = torch.triu(torch.ones(x.shape[1], x.shape[1], dtype=torch.bool), 1)
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class LM(nn.Module):
    def __init__(self):
        super().__init__()
        self.tok, self.pos = nn.Embedding(V, D), nn.Parameter(torch.randn(T, D) * 0.02)
        self.blocks = nn.Sequential(Block(), Block())
        self.ln, self.head = nn.LayerNorm(D), nn.Linear(D, V)

    def forward(self, x):
        return self.head(self.ln(self.blocks(self.tok(x) + self.pos[: x.shape[1]])))


def data(n=512, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, V, (n, T + 1), generator=g)
    return TensorDataset(x[:, :-1], x[:, 1:])


def schedule(steps, warm=4):
    return lambda s: (s + 1) / warm if s < warm else 0.5 * (1 + math.cos(math.pi * (s - warm) / max(1, steps - warm)))


def train(ddp: bool, steps=20, batch=16, lr=3e-3, bug_lr=0.0, bug_from=10, seed=0):
    torch.manual_seed(0)
    model = LM()
    world = tdist.get_world_size() if ddp else 1
    ds = data(seed=seed)
    if ddp:
        model = nn.parallel.DistributedDataParallel(model)
        loader = DataLoader(ds, batch_size=batch // world, sampler=DistributedSampler(ds, shuffle=True, seed=seed))
    else:
        loader = DataLoader(ds, batch_size=batch, sampler=DistributedSampler(ds, num_replicas=1, rank=0, shuffle=True, seed=seed))
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule(steps))
    step = 0
    for epoch in range(100):
        loader.sampler.set_epoch(epoch)
        for x, y in loader:
            loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            if bug_lr and step >= bug_from:
                for g in opt.param_groups:
                    g["lr"] *= 1 + bug_lr
            opt.step()
            if bug_lr and step >= bug_from:
                for g in opt.param_groups:
                    g["lr"] /= 1 + bug_lr
            sched.step()
            step += 1
            if step >= steps:
                return


def resumable(steps=20, batch=16, lr=3e-3, forget_scheduler=False, resumed_lr=0.0, every=4, last_lr=0.0):
    """``last_lr``: the resumed run's last step alone takes lr x (1 + last_lr)."""
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(LM())
    ds = data()
    world = torch.distributed.get_world_size()
    loader = DataLoader(ds, batch_size=batch // world, sampler=DistributedSampler(ds, shuffle=True, seed=0))
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, schedule(steps))
    step, resumed = 0, False
    if os.path.exists("ckpt.pt"):
        ck = torch.load("ckpt.pt")
        model.module.load_state_dict(ck["model"]); opt.load_state_dict(ck["opt"])
        if not forget_scheduler:
            sched.load_state_dict(ck["sched"])
        step, resumed = ck["step"], True
        if resumed_lr:
            for g in opt.param_groups:
                g["lr"] *= 1 + resumed_lr
    epoch = 0
    while step < steps:
        loader.sampler.set_epoch(epoch)
        for i, (x, y) in enumerate(loader):
            if i < step - epoch * len(loader):
                continue
            loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            if resumed and last_lr and step == steps - 1:
                for g in opt.param_groups:
                    g["lr"] *= 1 + last_lr
            opt.step()
            sched.step()
            step += 1
            if step % every == 0 and torch.distributed.get_rank() == 0:
                torch.save({"model": model.module.state_dict(), "opt": opt.state_dict(),
                            "sched": sched.state_dict(), "step": step}, "ckpt.pt")
            torch.distributed.barrier()
            if step >= steps:
                return
        epoch += 1


def accumulate(ddp: bool, steps=6, k=4, divide=True, batch=16, lr=3e-3):
    torch.manual_seed(0)
    model = LM()
    world = tdist.get_world_size() if ddp else 1
    if ddp:
        model = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    ds = data()
    x_all, y_all = ds.tensors
    rank = tdist.get_rank() if ddp else 0
    for step in range(steps):
        xs = x_all[step * batch:(step + 1) * batch]; ys = y_all[step * batch:(step + 1) * batch]
        if ddp:
            per = batch // world
            xs, ys = xs[rank * per:(rank + 1) * per], ys[rank * per:(rank + 1) * per]
        opt.zero_grad()
        for i, (x, y) in enumerate(zip(xs.chunk(k), ys.chunk(k))):
            loss = F.cross_entropy(model(x).flatten(0, 1), y.flatten())
            if divide or not ddp:
                loss = loss / k
            if ddp and i < k - 1:
                with model.no_sync():
                    loss.backward()
            else:
                loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
